"""LiteRT ``.tflite`` through litert-torch; int8 is PT2E dynamic-range (int8 weights per channel)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # torch is imported by export() only: profiles are read on torch-free devices
    import torch

    from .nesting import Ranges

QUANTS = ("fp32", "int8-dynamic")
TOOLS = ("torch", "litert-torch", "ai-edge-litert")
# litert-torch prints a log line per stage; our progress display replaces them. Set before any import.
os.environ.setdefault("LITERT_TORCH_SHOW_PROGRESS", "n")
NESTED = ("int8-dynamic",)  # quants whose weights take given ranges (convert.nesting)
IMPORTS = ("litert_torch", "torchao.quantization.pt2e.quantize_pt2e")  # warmed before timing, so convert_seconds excludes import time


def export(model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
           calibration: np.ndarray, path: Path, stage: Callable[[str], None],
           ranges: Ranges | None = None) -> dict[str, Any]:
    """Write ``model`` as a ``.tflite`` to ``path``; returns notes for the manifest.

    ``ranges``: the largest head count's per-row weight ranges, so the int8 weights are nested.
    """
    stage("import litert-torch")
    import litert_torch

    kwargs: dict[str, Any] = {}
    if quant == "int8-dynamic":
        from litert_torch.quantize import pt2e_quantizer as pq
        from litert_torch.quantize.quant_config import QuantConfig

        from .pt2e import quantize

        stage("quantise (PT2E)")
        quantizer = pq.PT2EQuantizer().set_global(
            pq.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
        )
        # litert-torch folds the quantize ops itself; folding here would hide them from it.
        model = quantize(model, example, quantizer, calibration[:1], fold_quantize=False, ranges=ranges)
        kwargs["quant_config"] = QuantConfig(pt2e_quantizer=quantizer)
    stage("convert (LiteRT)")
    edge = litert_torch.convert(model, (example,), **kwargs)
    stage("serialise")
    edge.export(str(path))
    return {"scheme": "PT2E dynamic-range: int8 per-channel weights, int8 activations per inference"
            if quant != "fp32" else "float32"}
