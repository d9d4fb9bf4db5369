"""PT2E quantisation shared by the LiteRT and ExecuTorch exporters (they differ only in the quantizer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .nesting import Ranges


def weight_observers(graph: torch.fx.GraphModule) -> dict[str, Any]:
    """``{parameter name: per-channel observer}`` of a prepared graph.

    A weight observer is a ``call_module`` node whose input is a ``get_attr`` of the parameter,
    named as in the exported module (``blocks.0.attn.qkv.weight``).
    """
    out = {}
    for node in graph.graph.nodes:
        if node.op == "call_module" and node.args and getattr(node.args[0], "op", None) == "get_attr":
            observer = getattr(graph, node.target)
            if hasattr(observer, "ch_axis"):
                out[node.args[0].target] = observer
    return out


def _nest(graph: torch.fx.GraphModule, ranges: Ranges) -> None:
    """Give each weight observer the largest head count's ranges of its rows (``nesting``)."""
    for name, observer in weight_observers(graph).items():
        if name not in ranges:  # not shared with the largest head count: its own ranges
            continue
        lo, hi = ranges[name]
        if observer.ch_axis != 0 or observer.min_val.shape != lo.shape:
            raise ValueError(f"weight observer of {name}: axis {observer.ch_axis}, {tuple(observer.min_val.shape)} "
                             f"ranges; nested ranges are per output row, {tuple(lo.shape)}")
        observer.min_val.copy_(lo)
        observer.max_val.copy_(hi)


def quantize(model: torch.nn.Module, example: torch.Tensor, quantizer: Any, calibration: np.ndarray,
             fold_quantize: bool = True, ranges: Ranges | None = None) -> torch.fx.GraphModule:
    """Export, insert observers, run calibration images one at a time (batch 1, as exported), convert.

    Dynamic schemes only need one pass so that per-channel weight observers see the weights;
    static ones take their activation ranges from ``calibration``. With ``ranges`` the weight
    observers then take the largest head count's per-row ranges, so the weights are nested.
    """
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = prepare_pt2e(torch.export.export(model, (example,)).module(), quantizer)
    move_exported_model_to_eval(graph)  # exported graphs refuse .eval(); this is PT2E's way
    with torch.no_grad():
        for x in calibration if len(calibration) else example.numpy():
            graph(torch.from_numpy(np.ascontiguousarray(x[None])))
    if ranges is not None:
        _nest(graph, ranges)
    converted = convert_pt2e(graph, fold_quantize=fold_quantize)
    # The graph was exported from an eval-mode model and moved to eval above, but a fresh
    # GraphModule says training=True, and converters (litert-torch) warn on it. Module.train
    # itself, since an exported graph's own .eval() refuses.
    torch.nn.Module.train(converted, False)
    return converted


def attention_matmul_quantizer() -> Any:
    """A PT2E quantizer giving every ``bmm`` static per-tensor int8 inputs and output.

    The attention's two batch matmuls multiply activation by activation, so a dynamic-range scheme
    leaves them in float32 (XNNPACK's "Batch Matrix Multiply (NC, F32)", a large share of a small
    subnetwork's time: docs/benchmarks.md). XNNPACK runs them in int8 ("NC, QS8": int8 x int8 -> int8,
    the right-hand side with zero point 0, repacked per inference) when each operand and the result
    have a fixed scale: calibrated ranges, per tensor. The left-hand operand (softmax output, or Q)
    is asymmetric; the right-hand one (K, V) symmetric, as the kernel requires.
    Compose it with the weights' quantizer (``ComposableQuantizer``); it annotates nothing else.
    """
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

    def spec(symmetric: bool) -> QuantizationSpec:
        return QuantizationSpec(
            dtype=torch.int8, quant_min=-127 if symmetric else -128, quant_max=127, is_dynamic=False,
            qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))

    class AttentionMatmulQuantizer(Quantizer):
        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            for node in model.graph.nodes:
                if node.op == "call_function" and node.target == torch.ops.aten.bmm.default:
                    lhs, rhs = node.args[:2]
                    node.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={lhs: spec(False), rhs: spec(True)}, output_qspec=spec(False),
                        _annotated=True)
            return model

        def validate(self, model: torch.fx.GraphModule) -> None:
            pass

    return AttentionMatmulQuantizer()
