"""ONNX for onnxruntime or TensorRT: fp32, fp16 (weights; fp32 I/O), int8 dynamic or static QDQ."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # torch is imported by export() only: profiles are read on torch-free devices
    import torch

    from .nesting import Ranges

QUANTS = ("fp32", "fp16", "int8-dynamic", "int8-qdq")
TOOLS = ("torch", "onnx", "onnxruntime")
NESTED = ("int8-qdq",)  # quants whose weights take given ranges (convert.nesting)
IMPORTS = ("onnx", "onnxruntime.quantization")  # warmed before timing, so convert_seconds excludes import time
OPSET = 17
INPUT, OUTPUT = "input", "logits"


def _calibration_reader(images: np.ndarray) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        """Feeds train-split images one at a time (the model is exported for batch 1)."""

        def __init__(self) -> None:
            self.images = iter(images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.images, None)
            return None if x is None else {INPUT: np.ascontiguousarray(x[None], dtype=np.float32)}

    return Reader()


def _weight_overrides(onnx_file: Path, model: torch.nn.Module, ranges: Ranges) -> dict[str, list[dict[str, Any]]]:
    """onnxruntime ``TensorQuantOverrides`` giving each weight initialiser its nested per-channel (rmin, rmax).

    The exporter renames weights (``onnx::MatMul_359``) and stores MatMul/Gemm weights as
    ``[in, out]``, so an initialiser is found by value: a parameter as it is (channel axis 0, as
    Gemm with transB and Conv keep it) or transposed (axis 1, as MatMul keeps it); each is the
    axis onnxruntime quantises that op's weight on anyway.
    """
    import onnx
    from onnx import numpy_helper

    params = dict(model.named_parameters())
    by_value: dict[tuple[tuple[int, ...], bytes], tuple[str, int]] = {}
    for name in ranges:
        w = params[name].detach().numpy()
        by_value[(w.shape, w.tobytes())] = (name, 0)
        if w.ndim == 2:
            by_value.setdefault((w.T.shape, np.ascontiguousarray(w.T).tobytes()), (name, 1))
    overrides = {}
    for init in onnx.load(str(onnx_file)).graph.initializer:
        a = numpy_helper.to_array(init)
        hit = by_value.get((a.shape, a.tobytes())) if a.dtype == np.float32 else None
        if hit is not None:
            name, axis = hit
            lo, hi = ranges[name]
            overrides[init.name] = [{"axis": axis, "rmin": rmin, "rmax": rmax}
                                  for rmin, rmax in zip(lo.tolist(), hi.tolist())]
    return overrides


def export(model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
           calibration: np.ndarray, path: Path, stage: Callable[[str], None],
           ranges: Ranges | None = None) -> dict[str, Any]:
    """Write ``model`` as ``.onnx`` to ``path``; returns notes for the manifest (incl. QDQ settings).

    ``ranges`` (int8-qdq): the largest head count's per-channel weight ranges, so the int8 weights
    and their scales are nested. The last block is exported for the class token only
    (``rewrites.class_token_only``): standard ops, so TensorRT builds it unchanged.
    """
    import torch

    import onnx

    from .rewrites import class_token_only, rewritten

    notes: dict[str, Any] = {"opset": OPSET, "scheme": "float32"}
    with tempfile.TemporaryDirectory(prefix="hydra-onnx-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        stage("export (ONNX)")
        # The TorchScript exporter: the graph is a plain ViT, and it exports much faster than dynamo
        # (docs/benchmarks.md).
        torch.onnx.export(rewritten(model, class_token_only), (example,), str(fp32), dynamo=False, opset_version=OPSET,
                          input_names=[INPUT], output_names=[OUTPUT])
        if quant == "fp32":
            shutil.copyfile(fp32, path)
        elif quant == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            stage("convert to fp16")
            # keep_io_types: the device feeds float32 images and reads float32 logits.
            onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(path))
            notes["scheme"] = "fp16 weights and activations, fp32 inputs/outputs"
        else:
            from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
            from onnxruntime.quantization.shape_inference import quant_pre_process

            stage("pre-process")
            prepped = Path(tmp) / "prepped.onnx"
            quant_pre_process(str(fp32), str(prepped))
            op_types = options.get("op_types_to_quantize")
            if quant == "int8-dynamic":
                stage("quantise (dynamic)")
                quantize_dynamic(str(prepped), str(path), weight_type=QuantType.QInt8, per_channel=True,
                                 op_types_to_quantize=op_types)
                notes["scheme"] = "int8 per-channel weights, dynamic int8 activations (QOperator)"
                notes["weights"] = "quantised per subnetwork, not nested: only int8-qdq takes given ranges"
            else:
                n = int(options.get("calibration_images", 128))
                method = options.get("calibrate_method", "MinMax")
                # Float outputs (OpTypesToExcludeOutputQuantization): a QDQ pair after a MatMul/Gemm makes
                # onnxruntime run what follows in int8 (QLinearSoftmax) or re-quantise and dequantise
                # (Gelu, LayerNorm), fixed costs that weigh most on small head counts; without it the
                # quantised MatMul/Gemm returns float, as TensorRT's own placement (Q/DQ on inputs) does.
                float_outputs = options.get("op_types_to_exclude_output_quantization", [])
                extra: dict[str, Any] = {"ActivationSymmetric": True, "OpTypesToExcludeOutputQuantization": float_outputs}
                if ranges is not None:
                    extra["TensorQuantOverrides"] = _weight_overrides(prepped, model, ranges)
                stage(f"calibrate ({min(n, len(calibration))} images)")
                quantize_static(str(prepped), str(path), _calibration_reader(calibration[:n]),
                                quant_format=QuantFormat.QDQ, per_channel=True,
                                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                                op_types_to_quantize=op_types, calibrate_method=CalibrationMethod[method],
                                extra_options=extra)
                notes.update(scheme="static int8 QDQ, symmetric activations, per-channel weights",
                             calibration_images=min(n, len(calibration)), calibrate_method=method,
                             op_types_to_quantize=op_types or "all", float_outputs=float_outputs)
    return notes


MIN_TENSOR_BYTES = 64  # smaller initialisers stay in the skeleton: too small to matter
# protobuf field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data and float_data
_GRAPH, _INITIALIZER, _RAW_DATA, _FLOAT_DATA = 7, 5, 9, 4


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(data: bytes, start: int, end: int, wanted: int) -> list[tuple[int, int]]:
    """(start, end) of every length-delimited field ``wanted`` of the protobuf message ``data[start:end]``."""
    out, i = [], start
    while i < end:
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            n, i = _varint(data, i)
            if key >> 3 == wanted:
                out.append((i, i + n))
            i += n
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {i}")
    return out


def tensor_map(data: bytes) -> list[Any]:
    """Where each initialiser's raw bytes lie in an ``.onnx`` file's bytes (for compaction).

    ONNX keeps an initialiser's values as one contiguous ``raw_data`` field, or (onnxruntime's
    quantisation scales) as a packed ``float_data`` field, whose little-endian floats are just as
    contiguous; the offset is read from the protobuf wire format (graph -> initializer -> field),
    not searched for.
    """
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    from .compact import Tensor

    (graph,) = _fields(data, 0, len(data), _GRAPH)[-1:]  # protobuf: the last occurrence wins
    spans = [_fields(data, a, b, _RAW_DATA)[-1:] or _fields(data, a, b, _FLOAT_DATA)[-1:]
             for a, b in _fields(data, *graph, _INITIALIZER)]
    model = onnx.load_from_string(data).graph
    initializers = model.initializer
    if len(spans) != len(initializers):
        raise ValueError(f"{len(initializers)} initialisers, {len(spans)} found in the file's bytes")
    per_channel = _per_channel(model)
    tensors = []
    for init, span in zip(initializers, spans):
        if not span or (span[0][1] - span[0][0] < MIN_TENSOR_BYTES and init.name not in per_channel):
            continue  # (a per-channel scale is kept however small: its weight is matched through it)
        (start, end), = span
        dtype = np.dtype(tensor_dtype_to_np_dtype(init.data_type)).newbyteorder("<")
        values = init.raw_data or np.asarray(init.float_data, dtype).tobytes()
        if data[start:end] != values:
            raise ValueError(f"initialiser {init.name}: its bytes are not where the wire format puts them")
        rows_of, axis = per_channel.get(init.name, (None, 0))
        tensors.append(Tensor(init.name, start, tuple(int(d) for d in init.dims), dtype, rows_of=rows_of, axis=axis))
    return tensors


def _per_channel(graph: Any) -> dict[str, tuple[str, int]]:
    """``{scale or zero-point initialiser: (the quantised weight it describes, its channel axis)}``.

    A QDQ artefact dequantises each int8 weight initialiser with a DequantizeLinear node whose
    scale (and zero point) has one value per channel along ``axis`` (default 1).
    """
    dims = {init.name: tuple(init.dims) for init in graph.initializer}
    out: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in dims:
            continue
        rank = len(dims[node.input[0]])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            continue
        for name in node.input[1:]:
            if len(dims.get(name, ())) == 1:  # a scalar is a per-tensor scale: not a function of the rows
                out[name] = (node.input[0], axis)
    return out
