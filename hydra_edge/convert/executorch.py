"""ExecuTorch ``.pte`` lowered to the XNNPACK delegate; int8 through PT2E with XNNPACK's quantizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # torch is imported by export() only: profiles are read on torch-free devices
    import torch

    from .nesting import Ranges

QUANTS = ("fp32", "int8-dynamic", "int8-static")
TOOLS = ("torch", "executorch")
NESTED = ("int8-dynamic", "int8-static")  # quants whose weights take given ranges (convert.nesting)
IMPORTS = ("executorch.exir", "executorch.backends.xnnpack.partition.xnnpack_partitioner")  # warmed before timing, so convert_seconds excludes import time


def export(model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
           calibration: np.ndarray, path: Path, stage: Callable[[str], None],
           ranges: Ranges | None = None) -> dict[str, Any]:
    """Write ``model`` as an XNNPACK-delegated ``.pte`` to ``path``; returns notes for the manifest.

    ``ranges``: the largest head count's per-row weight ranges, so the int8 weights are nested.
    """
    import torch

    stage("import executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    if quant != "fp32":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        from .pt2e import quantize

        stage("quantise (PT2E)")
        dynamic = quant == "int8-dynamic"
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
        )
        images = calibration[: 1 if dynamic else int(options.get("calibration_images", 64))]
        model = quantize(model, example, quantizer, images, ranges=ranges)
    stage("export")
    program = torch.export.export(model, (example,))
    stage("lower (XNNPACK)")
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    stage("serialise")
    path.write_bytes(lowered.buffer)
    schemes = {
        "fp32": "float32",
        "int8-dynamic": "PT2E: int8 per-channel symmetric weights, dynamic int8 activations",
        "int8-static": "PT2E: int8 per-channel weights, static int8 activations from train-split images",
    }
    return {"scheme": schemes[quant], "delegate": "XNNPACK"}
