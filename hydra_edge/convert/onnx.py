"""ONNX for onnxruntime or TensorRT: fp32, fp16 (weights; fp32 I/O), int8 dynamic or static QDQ."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # torch is imported by export() only: profiles are read on torch-free devices
    import torch

QUANTS = ("fp32", "fp16", "int8-dynamic", "int8-qdq")
TOOLS = ("torch", "onnx", "onnxruntime")
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


def export(model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
           calibration: np.ndarray, path: Path, stage: Callable[[str], None]) -> dict[str, Any]:
    """Write ``model`` as ``.onnx`` to ``path``; returns notes for the manifest (incl. QDQ settings)."""
    import torch

    import onnx

    notes: dict[str, Any] = {"opset": OPSET, "scheme": "float32"}
    with tempfile.TemporaryDirectory(prefix="hydra-onnx-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        stage("export (ONNX)")
        # The TorchScript exporter: ~10x faster than dynamo here and the graph is a plain ViT.
        torch.onnx.export(model, (example,), str(fp32), dynamo=False, opset_version=OPSET,
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
            else:
                n = int(options.get("calibration_images", 128))
                method = options.get("calibrate_method", "MinMax")
                stage(f"calibrate ({min(n, len(calibration))} images)")
                quantize_static(str(prepped), str(path), _calibration_reader(calibration[:n]),
                                quant_format=QuantFormat.QDQ, per_channel=True,
                                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                                op_types_to_quantize=op_types, calibrate_method=CalibrationMethod[method],
                                extra_options={"ActivationSymmetric": True})
                notes.update(scheme="static int8 QDQ, symmetric activations, per-channel weights",
                             calibration_images=min(n, len(calibration)), calibrate_method=method,
                             op_types_to_quantize=op_types or "all")
    return notes


MIN_TENSOR_BYTES = 64  # smaller initialisers stay in the skeleton: too small to matter, too likely to repeat


def tensor_map(data: bytes) -> list[Any]:
    """Where each initialiser's raw bytes lie in an ``.onnx`` file's bytes (for compaction).

    ONNX keeps an initialiser's values as one contiguous ``raw_data`` field, so its offset is where
    those bytes occur in the file; one whose bytes occur more than once is left out (ambiguous).
    """
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    from .compact import Tensor

    tensors = []
    for init in onnx.load_from_string(data).graph.initializer:
        raw = init.raw_data
        if len(raw) < MIN_TENSOR_BYTES or init.data_location != onnx.TensorProto.DEFAULT:
            continue
        offset = data.find(raw)
        if offset < 0 or data.find(raw, offset + 1) >= 0:
            continue
        dtype = np.dtype(tensor_dtype_to_np_dtype(init.data_type)).newbyteorder("<")
        tensors.append(Tensor(init.name, offset, tuple(int(d) for d in init.dims), dtype))
    return tensors
