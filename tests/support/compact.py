"""Bundles in a shipped target's format, converted once per variant and test module: full and compact.

A small digits model (depth 1, heads 3/6/12, random weights) holds every kind of weight; ``converted``
makes a variant's ``full`` bundle and compacts a copy of it, so the tests of compact bundles (their
layout, ``expand``, the Android rebuild) compare the two. Fixtures: ``model_file``, ``converted``,
``root`` (jetson fp16). ``android_bundle``: the phone's .pte bundle the app tests build into an APK
and calibrate through.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest
import torch

from hydra_edge.convert import pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT

HEADS = "3,6,12"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits model (depth 1, heads 3/6/12, random weights): one block holds every kind of weight.

    One weight is below fp16's smallest subnormal, which ONNX's fp16 conversion rounds its own way."""
    path = tmp_path_factory.mktemp("model") / "m.pt"
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 6, 12)))
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0, 0] = 1e-9
    model.save(path)
    return path


@pytest.fixture(scope="module")
def converted(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """The model converted for a target variant, ``full``, and compacted from a copy of it (``compact``):
    the same verified artefacts, converted once per variant and module."""
    done: Dict[Tuple[str, str], Path] = {}

    def get(target: str, quant: str) -> Path:
        if (target, quant) not in done:
            root = tmp_path_factory.mktemp(f"{target}-{quant}")
            shutil.copyfile(model_file, root / "m.pt")
            for layout in ("full", "compact"):
                if layout == "compact":
                    shutil.copytree(root / "full", root / "compact")
                result = pipeline.convert(ConvertOptions(
                    checkpoint=root / "m.pt", target=target, quant=quant, heads=HEADS, out=root / layout,
                    eval_limit=16, layout=layout))
                assert not result.failed and len(result.converted) == (3 if layout == "full" else 0)
            done[target, quant] = root
        return done[target, quant]
    return get


@pytest.fixture(scope="module")
def root(converted: Callable[[str, str], Path]) -> Path:
    """jetson fp16, for what does not depend on the format (golden files, calibration, the switcher)."""
    return converted("jetson", "fp16")


def android_bundle(root: Path, layout: str) -> Path:
    """A depth-1 digits model (random weights, seed 0) converted for android in ``layout`` (``full``, or
    ``compact``: 3 heads over 12 heads' .pte), its bundle in ``root/bundle``."""
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=1, heads=(3, 12))).save(root / "m.pt")
    result = pipeline.convert(ConvertOptions(checkpoint=root / "m.pt", target="android", quant="int8-dynamic",
                                             heads="3,12", out=root / "bundle", eval_limit=16, layout=layout))
    assert not result.failed and len(result.converted) == 2
    return root / "bundle"
