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
    The whole network lowers into XNNPACK: LayerNorm is written with ops XNNPACK runs
    (``_xnnpack_norms``), and ExecuTorch's own XNNPACK lowering passes drop the shape-only copies
    (no-op expands, squeezes) that would otherwise run as portable kernels between delegate calls.
    A small subnetwork spent a third of its time in those kernels and the calls around them. The
    patch convolution runs as a fully-connected layer (``rewrites.PatchLinearEmbed``) and the last
    block for the class token only (``rewrites.class_token_only``).
    Quantised, the attention's activation x activation matmuls run in XNNPACK's int8 batch matmul
    with calibrated per-tensor ranges unless the profile keeps them in float (``attention``,
    ``pt2e.attention_matmul_quantizer``); ExecuTorch's own
    partitioner takes a ``bmm`` in float32 only, so ``_partitioner`` lets it take the int8 one too.
    """
    import torch

    stage("import executorch")
    from executorch.backends.transforms.replace_squeeze_unsqueeze_with_view import (
        ReplaceSqueezeAndUnsqueezeWithViewPass,
    )
    from executorch.backends.xnnpack.utils.configs import (
        get_transform_passes,
        get_xnnpack_edge_compile_config,
        get_xnnpack_executorch_backend_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    from .attention import CALIBRATION_IMAGES, attention_matmuls
    from .rewrites import bmm_attention, class_token_only, patch_linear, rewritten

    int8_attention = quant != "fp32" and attention_matmuls(options) == "int8"
    changes = (class_token_only, patch_linear, *([bmm_attention] if int8_attention else []))
    model = rewritten(model, *changes)
    norm_type = _xnnpack_norms(model)
    if quant != "fp32":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer

        from .pt2e import attention_matmul_quantizer, quantize

        stage("quantise (PT2E)")
        dynamic = quant == "int8-dynamic"
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
        ).set_module_type(norm_type, None)  # LayerNorm stays float, as nn.LayerNorm did
        images = calibration[: CALIBRATION_IMAGES if dynamic else int(options.get("calibration_images", 64))]
        if int8_attention:
            quantizer = ComposableQuantizer([quantizer, attention_matmul_quantizer()])
        model = quantize(model, example, quantizer, images, ranges=ranges)
    stage("export")
    program = torch.export.export(model, (example,))
    if quant == "fp32":  # the patch kernel read as a matrix is a view of a parameter, which XNNPACK does not
        program = constant_prop_pass(program)  # take as a weight: folded into a constant, as PT2E's convert does
    stage("lower (XNNPACK)")
    lowered = to_edge_transform_and_lower(
        program, partitioner=[_partitioner()], compile_config=get_xnnpack_edge_compile_config(),
        transform_passes=get_transform_passes([ReplaceSqueezeAndUnsqueezeWithViewPass()]),
    ).to_executorch(get_xnnpack_executorch_backend_config())
    stage("serialise")
    path.write_bytes(lowered.buffer)
    schemes = {
        "fp32": "float32",
        "int8-dynamic": "PT2E: int8 per-channel symmetric weights, dynamic int8 activations",
        "int8-static": "PT2E: int8 per-channel weights, static int8 activations from train-split images",
    }
    scheme = schemes[quant]
    if int8_attention:
        scheme += "; attention matmuls int8 with per-tensor ranges from train-split images"
    return {"scheme": scheme, "delegate": "XNNPACK"}


def _partitioner() -> Any:
    """ExecuTorch's XNNPACK partitioner, whose ``bmm`` also takes int8 operands between quantize/dequantize.

    Its own ``BMMConfig`` declares float32 only, so a quantised ``bmm`` and its quantize/dequantize
    nodes were left out of the delegate. XNNPACK itself defines an int8 x int8 batch matmul (both
    per-tensor, the right-hand zero point 0), which the delegate's serialiser already writes from
    the dequantize nodes' parameters.
    """
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.generic_node_configs import BMMConfig
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class Int8BMMConfig(BMMConfig):
        def supported_precision_types(self) -> list[ConfigPrecisionType]:
            return [ConfigPrecisionType.FP32, ConfigPrecisionType.STATIC_QUANT]

    return XnnpackPartitioner(configs=[Int8BMMConfig if c is BMMConfig else c for c in ALL_PARTITIONER_CONFIGS])


def _xnnpack_norms(model: torch.nn.Module) -> type:
    """Rewrite ``model``'s LayerNorms, in place, as ops XNNPACK runs; returns their type (for the quantizer to skip).

    ExecuTorch's XNNPACK partitioner has no LayerNorm, so ``nn.LayerNorm`` ran as a portable kernel
    (slower than the int8 matmuls around it at 3 heads) and cut the network into a delegate call per
    block half. Here it is written with XNNPACK's own mean, which takes a 4-D tensor's two innermost
    axes: (batch, tokens, channels, 1). No constant is added and the LayerNorm's parameters keep their
    names, so nesting and compaction see the same weights.
    """
    import torch
    import torch.nn.functional as F

    class XnnpackLayerNorm(torch.nn.Module):
        def __init__(self, norm: torch.nn.LayerNorm) -> None:
            super().__init__()
            self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dim() != 3:  # XNNPACK's mean needs (batch, tokens, channels, 1)
                return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
            x = x.unsqueeze(-1)
            centred = x - x.mean((2, 3), keepdim=True)
            normed = centred * torch.rsqrt((centred * centred).mean((2, 3), keepdim=True) + self.eps)
            return normed.squeeze(-1) * self.weight + self.bias

    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if (isinstance(child, torch.nn.LayerNorm) and len(child.normalized_shape) == 1 and child.elementwise_affine
                    and child.bias is not None):
                setattr(parent, name, XnnpackLayerNorm(child))
    return XnnpackLayerNorm


# A .pte keeps the XNNPACK delegates' constants in the program's named data (one segment per unique
# constant, keyed by its sha256) and the constants left to portable kernels (none, when the whole
# network is delegated) in its constant segment. The delegate graphs (XNNGraph flatbuffers) say each
# named constant's dtype, shape and per-channel scale.
_SCALAR_TYPES = {0: "|u1", 1: "|i1", 2: "<i2", 3: "<i4", 4: "<i8", 5: "<f2", 6: "<f4", 7: "<f8"}  # exir ScalarType
_XNN_TYPES = {"fp32": "<f4", "fp16": "<f2", "qint8": "|i1", "quint8": "|u1", "qint32": "<i4", "qcint8": "|i1",
              "qcint32": "<i4", "int32": "<i4"}  # XNNDatatype without its "xnn_datatype_" prefix
_NAMED = 2**64 - 1  # ConstantDataOffset.offset of a constant stored in the program's named data


def _xnn_graph(blob: bytes) -> Any:
    """A delegate payload's XNNGraph, read with executorch's own schema, flatc and dataclasses."""
    import importlib.resources
    import json
    import tempfile

    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import XNNGraph
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
    from executorch.exir._serialize._dataclass import _json_to_dataclass
    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    header = XNNHeader.from_bytes(blob[:XNNHeader.EXPECTED_LENGTH])
    schema = importlib.resources.files("executorch.backends.xnnpack.serialization") / "schema.fbs"
    with tempfile.TemporaryDirectory(prefix="hydra-xnn-") as tmp, importlib.resources.as_file(schema) as fbs:
        graph = Path(tmp) / "graph.bin"
        graph.write_bytes(blob[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size])
        _flatc_decompile(tmp, str(fbs), str(graph), ["--raw-binary"])
        return _json_to_dataclass(json.loads((Path(tmp) / "graph.json").read_text()), XNNGraph), header


def _delegate_tensors(data: bytes, blob_at: int, size: int, named: dict[str, int]) -> list[Any]:
    """The constants one XNNPACK delegate reads: weights, and each per-channel scale as a per-row tensor."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import (
        PerChannelQuant,
        XNNQuantizedTensorValue,
    )

    from .compact import Tensor

    graph, header = _xnn_graph(data[blob_at:blob_at + size])
    constants = graph.constant_data

    def where(idx: int) -> tuple[str, int]:
        c = constants[idx]
        if c.offset == _NAMED:
            return c.named_key, named[c.named_key]
        return f"{blob_at}+{c.offset}", blob_at + header.constant_data_offset + c.offset

    out = []
    for value in graph.xvalues:
        v = value.xvalue_union
        t = v.tensor_value if isinstance(v, XNNQuantizedTensorValue) else v
        dtype = _XNN_TYPES.get(t.datatype.name.replace("xnn_datatype_", ""))
        if not t.constant_buffer_idx or dtype is None:
            continue
        name, offset = where(t.constant_buffer_idx)
        out.append(Tensor(name, offset, tuple(t.dims), np.dtype(dtype)))
        q = v.quant_params if isinstance(v, XNNQuantizedTensorValue) else None
        if isinstance(q, PerChannelQuant) and q.scale_buffer_idx > 0:
            scale, at = where(q.scale_buffer_idx)
            out.append(Tensor(scale, at, (q.num_scales,), np.dtype("<f4"), rows_of=name, axis=q.channel_dim))
    return out


def tensor_map(data: bytes) -> list[Any]:
    """Where each constant's raw bytes lie in an XNNPACK ``.pte`` file's bytes (for compaction).

    Read with executorch's own deserialisers: the program flatbuffer gives the segments, the named
    data and the constant segment; each delegate's XNNGraph gives its constants' dtypes and shapes.
    A constant shared by several delegates (they are keyed by content) is listed once.
    """
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header
    from executorch.exir.schema import DataLocation, Tensor as EValueTensor

    from .compact import Tensor

    header = _get_extended_header(data)
    if header is None or not header.is_valid():
        raise ValueError("no extended header: the .pte keeps no segments to compact")
    program = _flatbuffer_to_program(data[:header.program_size])
    segments = [(header.segment_base_offset + s.offset, s.size) for s in program.segments]
    named = {n.key: segments[n.segment_index][0] for n in program.named_data or []}
    tensors = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            if delegate.processed.location != DataLocation.SEGMENT:
                raise ValueError(f"delegate {delegate.id}: payload kept inline, not in a segment")
            tensors += _delegate_tensors(data, *segments[delegate.processed.index], named)
        constant = program.constant_segment
        for value in plan.values:
            t = value.val
            if (isinstance(t, EValueTensor) and t.data_buffer_idx > 0 and t.allocation_info is None
                    and int(t.scalar_type) in _SCALAR_TYPES and list(t.dim_order) == sorted(t.dim_order)):
                offset = segments[constant.segment_index][0] + constant.offsets[t.data_buffer_idx]
                tensors.append(Tensor(f"constant{t.data_buffer_idx}", offset, tuple(t.sizes),
                                      np.dtype(_SCALAR_TYPES[int(t.scalar_type)])))
    unique: dict[int, Any] = {}
    for t in tensors:
        unique.setdefault(t.offset, t)
    return sorted(unique.values(), key=lambda t: t.offset)
