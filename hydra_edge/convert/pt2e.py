"""PT2E quantisation shared by the LiteRT and ExecuTorch exporters (they differ only in the quantizer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def quantize(model: torch.nn.Module, example: torch.Tensor, quantizer: Any, calibration: np.ndarray,
             fold_quantize: bool = True) -> torch.fx.GraphModule:
    """Export, insert observers, run calibration images one at a time (batch 1, as exported), convert.

    Dynamic schemes only need one pass so that per-channel weight observers see the weights;
    static ones take their activation ranges from ``calibration``.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = prepare_pt2e(torch.export.export(model, (example,)).module(), quantizer)
    with torch.no_grad():
        for x in calibration if len(calibration) else example.numpy():
            graph(torch.from_numpy(np.ascontiguousarray(x[None])))
    return convert_pt2e(graph, fold_quantize=fold_quantize)
