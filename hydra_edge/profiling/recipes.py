"""The artefacts' int8 recipes applied to any module: an FC layer that gives a runtime's int8 rate,
or a subnetwork fed a batch (``Stacked``), exported as the target profile's artefact would be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_edge.convert.formats import exporter
from hydra_edge.convert.targets import load_target

# (format, quant, target whose profile gives the exporter options): the artefacts' recipes
RECIPES = (("tflite", "int8-dynamic", "rpi"), ("executorch", "int8-dynamic", "android"), ("onnx", "int8-qdq", "jetson"))


def recipe_options(fmt: str, quant: str, target: str) -> dict[str, Any]:
    """The exporter options the target profile gives this format and quantisation."""
    return next(dict(v.options) for v in load_target(target).artefacts if (v.format, v.quant) == (fmt, quant))


def export_with_recipe(module: torch.nn.Module, x: np.ndarray, fmt: str, quant: str, target: str,
                       calibration_shape: tuple[int, ...], path: Path, what: str) -> Path:
    """``module`` fed ``x``, exported with the recipe ``target``'s profile gives (fmt, quant); random calibration."""
    options = recipe_options(fmt, quant, target)
    rng = np.random.default_rng(0)
    calibration = rng.standard_normal((int(options.get("calibration_images", 1)), *calibration_shape), dtype=np.float32)
    print(f"{what}: {fmt} {quant}", flush=True)
    with torch.no_grad():
        exporter(fmt).export(module, torch.from_numpy(x), quant, options, calibration, path,
                             lambda s: print(f"  {fmt}: {s}", flush=True))
    return path


class Stacked(torch.nn.Module):
    """A subnetwork fed ``batch`` images stacked along channels, (1, batch*C, H, W), split into a batch.

    The exporters calibrate one image at a time (``x[None]``), so a batch-b program whose input is
    one "image" of b*C channels calibrates as it is. The batch is its b channel groups concatenated
    along the batch axis, not a reshape: ExecuTorch 1.5's XNNPACK lowering, moving a dynamically
    quantised convolution's input to channels-last, follows first arguments back from the quantise
    node through any op to the node that has none (a reshape back to the program's input), so the
    patch embedding's convolution was handed the (1, H, W, b*C) input and XNNPACK refused the
    program at run time ("Propagating input shapes failed"). A concatenation (a list as its first
    argument) ends that walk. It costs one copy of the input (4.8 MB for eight 224 px images), small
    next to eight inferences.
    """

    def __init__(self, model: torch.nn.Module, batch: int) -> None:
        super().__init__()
        self.model, self.batch = model, batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(torch.cat(x.split(x.shape[1] // self.batch, dim=1)))
