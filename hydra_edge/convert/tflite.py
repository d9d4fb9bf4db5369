"""LiteRT ``.tflite`` through litert-torch; int8 is PT2E dynamic-range (int8 weights per channel), with
the attention matmuls in static int8 through ai-edge-quantizer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .attention import CALIBRATION_IMAGES, attention_matmuls

if TYPE_CHECKING:  # torch is imported by export() only: profiles are read on torch-free devices
    import torch

    from .nesting import Ranges

QUANTS = ("fp32", "int8-dynamic")
TOOLS = ("torch", "litert-torch", "ai-edge-quantizer", "ai-edge-litert")
# litert-torch prints a log line per stage; our progress display replaces them. Set before any import.
os.environ.setdefault("LITERT_TORCH_SHOW_PROGRESS", "n")
NESTED = ("int8-dynamic",)  # quants whose weights take given ranges (convert.nesting)
IMPORTS = ("litert_torch", "torchao.quantization.pt2e.quantize_pt2e", "ai_edge_quantizer.quantizer")  # warmed before timing, so convert_seconds excludes import time


def export(model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
           calibration: np.ndarray, path: Path, stage: Callable[[str], None],
           ranges: Ranges | None = None) -> dict[str, Any]:
    """Write ``model`` as a ``.tflite`` to ``path``; returns notes for the manifest.

    ``ranges``: the largest head count's per-row weight ranges, so the int8 weights are nested.
    """
    stage("import litert-torch")
    import litert_torch

    model = for_xnnpack(model)
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
    if quant == "fp32":
        return {"scheme": "float32"}
    scheme = "PT2E dynamic-range: int8 per-channel weights, int8 activations per inference"
    if attention_matmuls(options) == "int8":
        stage("quantise attention matmuls (ai-edge-quantizer)")
        int8_batch_matmuls(path, calibration[:CALIBRATION_IMAGES] if len(calibration) else example.numpy())
        scheme += "; attention matmuls int8 with per-tensor ranges from train-split images"
    return {"scheme": scheme}


def int8_batch_matmuls(path: Path, images: np.ndarray) -> None:
    """Rewrite the ``.tflite`` at ``path`` with every BATCH_MATMUL in static int8, all else as it was.

    litert-torch cannot do this from PT2E: it carries a ``bmm``'s fixed int8 ranges back through the
    reshapes into the QKV layer, whose int8 output from a float input LiteRT refuses to run
    (docs/dependencies.md). ai-edge-quantizer works on the converted model instead: it puts a
    QUANTIZE before each batch matmul operand and a DEQUANTIZE after it, and leaves every other op
    and every int8 weight byte as it was, so nesting and compaction see the same weights (it stores
    buffers after the flatbuffer, which ``tensor_map`` reads).

    - Ranges are each tensor's min and max over all of ``images``. ai-edge-quantizer's default keeps
      a moving average (0.95) of per-image ranges, which clips what later images reach and costs
      logit SQNR that the true min/max keeps (docs/benchmarks.md).
    - Symmetric: XNNPACK's int8 batch matmul needs the right operand's zero point at 0; without it
      LiteRT's own int8 kernel runs them, much slower than float32 (docs/benchmarks.md).
    - The transposes and reshapes that lay the heads out (``rewrites.HeadsApartAttention``, named in
      the converter's tensor names) move int8: each operand is quantised once, before its transpose,
      with the range it has at the matmul (a transpose keeps it), and the heads come back in int8
      before one dequantise. The same values, a quarter of the bytes moved (docs/benchmarks.md).
    """
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import calibrator, qtyping, quantizer, recipe_manager
    from ai_edge_quantizer.utils import qsv_utils

    from .rewrites import HeadsApartAttention

    model = path.read_bytes()
    if not _has_op(model, "BATCH_MATMUL"):  # no attention (a single layer): nothing to calibrate or rewrite
        return
    recipe = recipe_manager.RecipeManager()
    int8 = qtyping.TensorQuantizationConfig(num_bits=8, symmetric=True)
    # a batch matmul's operands are activations; the weight config is required
    config = qtyping.OpQuantizationConfig(activation_tensor_config=int8, weight_tensor_config=int8,
                                          compute_precision=qtyping.ComputePrecision.INTEGER)
    recipe.add_quantization_config(regex=".*", operation_name=qtyping.TFLOperationName.BATCH_MATMUL, op_config=config)
    for op in (qtyping.TFLOperationName.TRANSPOSE, qtyping.TFLOperationName.RESHAPE):
        recipe.add_quantization_config(regex=f".*{HeadsApartAttention.__name__}.*", operation_name=op, op_config=config)
    (signature, io), = Interpreter(model_content=model).get_signature_list().items()  # litert-torch: one, one input
    (name,) = io["inputs"]
    ranges = calibrator.Calibrator(model, num_threads=len(os.sched_getaffinity(0)),
                                   qsv_update_func=qsv_utils.min_max_update)
    ranges.calibrate({signature: [{name: np.ascontiguousarray(x[None])} for x in images]}, recipe)
    q = quantizer.Quantizer(model, recipe.get_quantization_recipe())
    q.quantize(ranges.get_model_qsvs(), enable_progress_bar=False).export_model(str(path), overwrite=True)


def _has_op(data: bytes, op: str) -> bool:
    """Whether the ``.tflite`` in ``data`` holds a builtin operator named ``op`` (schema.fbs's name)."""
    from ai_edge_litert import schema_py_generated as fb

    model, code = fb.Model.GetRootAs(data, 0), getattr(fb.BuiltinOperator, op)
    return any(max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode()) == code
               for i in range(model.OperatorCodesLength()))


def for_xnnpack(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with the same parameters and logits, written as XNNPACK runs fastest.

    LiteRT's own op profile of a 3-head b16 (docs/benchmarks.md, bench/op_profile_litert.py) showed
    the fixed costs these remove: the patch convolution reading 3 channels per kernel tap
    (``rewrites.PatchRowsEmbed``), K transposed on its own in every block (``rewrites.BmmAttention``),
    V packed from the slow layout and the heads split through copying reshapes
    (``rewrites.HeadsApartAttention``), LayerNorm as twelve operators (``rewrites.CentredLayerNorm``),
    and the last block's work on tokens the logits never read (``rewrites.class_token_only``).
    """
    from .rewrites import bmm_attention, centred_layer_norm, class_token_only, heads_apart, patch_rows, rewritten

    return rewritten(model, class_token_only, bmm_attention, heads_apart, patch_rows, centred_layer_norm)


# TensorType -> numpy dtype string, for the types a converted ViT stores (schema.fbs)
_TYPES = {0: "<f4", 1: "<f2", 2: "<i4", 3: "|u1", 4: "<i8", 7: "<i2", 9: "|i1", 10: "<f8"}
# vtable slots (schema.fbs field id * 2 + 4): Buffer.data, QuantizationParameters.scale / .zero_point
_DATA, _SCALE, _ZERO_POINT = 4, 8, 10


def _vector(table: Any, slot: int) -> tuple[int, int] | None:
    """(byte offset, length) of a flatbuffer table's vector field, None when absent."""
    at = table.Offset(slot)
    return (table.Vector(at), table.VectorLen(at)) if at else None


def tensor_map(data: bytes) -> list[Any]:
    """Where each constant's raw bytes lie in a ``.tflite`` file's bytes (for compaction).

    Read from the flatbuffer with the schema ai-edge-litert ships (no TensorFlow): every tensor
    whose buffer holds data, and a quantised tensor's per-channel scale and zero-point vectors as
    per-row tensors of it. A buffer shared by several tensors is listed once.
    """
    from ai_edge_litert import schema_py_generated as fb

    from .compact import Tensor

    model = fb.Model.GetRootAs(data, 0)
    tensors: dict[int, Any] = {}
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.TensorsLength()):
            t = graph.Tensors(i)
            buffer = model.Buffers(t.Buffer())
            name = f"subgraph {g} tensor {i}"  # its own name is the converter's trace, not the weight's
            # offset > 1: the bytes lie after the flatbuffer, at that file offset (how ai-edge-quantizer
            # writes a model over 256 KiB); 0 or 1: inline in Buffer.data
            span = (buffer.Offset(), buffer.Size()) if buffer.Offset() > 1 else _vector(buffer._tab, _DATA)
            if span is not None and span[0] + span[1] > len(data):
                raise ValueError(f"tensor {name}: its data, bytes {span[0]}..{span[0] + span[1]}, lies beyond the "
                                 f"file's {len(data)} bytes: the .tflite is truncated or not LiteRT's")
            if span is None or not span[1] or t.Type() not in _TYPES or span[0] in tensors:
                continue
            shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            tensors[span[0]] = Tensor(name, span[0], shape, np.dtype(_TYPES[t.Type()]))
            q = t.Quantization()
            if q is None or not shape or q.ScaleLength() != shape[q.QuantizedDimension()]:
                continue
            for slot, what, dtype in ((_SCALE, "scale", "<f4"), (_ZERO_POINT, "zero point", "<i8")):
                rows = _vector(q._tab, slot)
                if rows is not None and rows[0] not in tensors:
                    tensors[rows[0]] = Tensor(f"{name} {what}", rows[0], (rows[1],), np.dtype(dtype),
                                              rows_of=name, axis=q.QuantizedDimension())
    return sorted(tensors.values(), key=lambda t: t.offset)
