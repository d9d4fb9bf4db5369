"""Real bundles, converted in seconds: a small untrained digits model for a target or a profile's text.

The tests that calibrate, run the device runner or deploy to a board need artefacts a runtime really
loads; a depth-2 model with 3, 6 and 12 heads, converted to fp32 ONNX on 60 images, is the cheapest.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hydra_edge.convert import pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT


def make_bundle(root: Path, target: str, heads: str, layout: str = "full") -> Path:
    """A depth-2 digits HydraViT (untrained) converted for ``target`` ("rpi" or a profile's text)."""
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=2, heads=(3, 6, 12))).save(root / "tiny.pt")
    if "\n" in target:
        (root / "host.toml").write_text(target)
        target = str(root / "host.toml")
    pipeline.convert(ConvertOptions(checkpoint=root / "tiny.pt", target=target, out=root / "bundle",
                                    heads=heads, data="digits", eval_limit=60, layout=layout))
    return root / "bundle"
