"""LiteRT's own op profiler, summed by op type: where a ``.tflite`` artefact's time goes.

ai-edge-litert's Python ``Interpreter`` and ``CompiledModel`` expose no profiler, and the wheel ships
no ``benchmark_model`` binary; its ``libLiteRt.so`` does export the C profiler API
(``LiteRtCompiledModelGetProfiler``, ``LiteRtGetProfilerEvents``), so this drives that through
ctypes: a CPU compiled model (XNNPACK) with the runtime option ``enable_profiling``. XNNPACK
reports each of its own operators ("Fully Connected (NC, QDU8, F32, QC8W) GEMM"), so the time
inside the delegate is broken down too; an op left outside it appears under its TFLite name.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

_OK = 0
_CPU = 1  # kLiteRtHwAcceleratorCpu
_READ, _WRITE = 0, 1  # kLiteRtTensorBufferLockMode{Read,Write}
_TYPE_BYTES = 512  # LiteRtRankedTensorType is filled and passed back by the library; room to spare
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_KEEP = _DESTRUCTOR(lambda p: None)  # option payloads are Python-owned buffers, kept alive below


def _library() -> Any:
    import ai_edge_litert

    lib = ctypes.CDLL(str(Path(ai_edge_litert.__file__).parent / "libLiteRt.so"))
    lib.LiteRtCreateOpaqueOptions.argtypes = [ctypes.c_char_p, ctypes.c_void_p, _DESTRUCTOR, ctypes.c_void_p]
    lib.LiteRtCreateModelFromFile.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    for name in ("LiteRtSetOptionsHardwareAccelerators", "LiteRtAddOpaqueOptions", "LiteRtCreateCompiledModel",
                 "LiteRtGetModelSignature", "LiteRtGetNumSignatureInputs", "LiteRtGetNumSignatureOutputs",
                 "LiteRtGetSignatureInputTensorByIndex", "LiteRtGetSignatureOutputTensorByIndex",
                 "LiteRtGetRankedTensorType", "LiteRtGetCompiledModelInputBufferRequirements",
                 "LiteRtGetCompiledModelOutputBufferRequirements", "LiteRtCreateManagedTensorBufferFromRequirements",
                 "LiteRtLockTensorBuffer", "LiteRtUnlockTensorBuffer", "LiteRtRunCompiledModel",
                 "LiteRtCompiledModelGetProfiler", "LiteRtStartProfiler", "LiteRtResetProfiler",
                 "LiteRtCreateEnvironment", "LiteRtCreateOptions", "LiteRtGetNumProfilerEvents", "LiteRtGetProfilerEvents"):
        getattr(lib, name).argtypes = None  # c_void_p / c_size_t arguments are passed explicitly
    return lib


def _check(status: int, what: str) -> None:
    if status != _OK:
        raise RuntimeError(f"LiteRT C API: {what} failed with status {status}")


def _opaque(lib: Any, identifier: bytes, toml: bytes, keep: list[Any]) -> ctypes.c_void_p:
    """An opaque option (identifier + TOML payload), as the C++ ``RuntimeOptions`` / ``CpuOptions`` build them."""
    payload = ctypes.create_string_buffer(toml)
    keep.append(payload)
    out = ctypes.c_void_p()
    _check(lib.LiteRtCreateOpaqueOptions(identifier, ctypes.cast(payload, ctypes.c_void_p), _KEEP, ctypes.byref(out)),
           f"options {identifier.decode()}")
    return out


def _buffers(lib: Any, env: ctypes.c_void_p, model: ctypes.c_void_p, compiled: ctypes.c_void_p,
             side: str) -> list[ctypes.c_void_p]:
    """Managed tensor buffers for signature 0's inputs or outputs, typed as the model's tensors."""
    signature, count = ctypes.c_void_p(), ctypes.c_size_t()
    _check(lib.LiteRtGetModelSignature(model, ctypes.c_size_t(0), ctypes.byref(signature)), "signature")
    _check(getattr(lib, f"LiteRtGetNumSignature{side}s")(signature, ctypes.byref(count)), f"{side} count")
    out = []
    for i in range(count.value):
        tensor, requirements, buffer = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        kind = ctypes.create_string_buffer(_TYPE_BYTES)
        _check(getattr(lib, f"LiteRtGetSignature{side}TensorByIndex")(signature, ctypes.c_size_t(i),
                                                                       ctypes.byref(tensor)), f"{side} tensor")
        _check(lib.LiteRtGetRankedTensorType(tensor, kind), f"{side} tensor type")
        _check(getattr(lib, f"LiteRtGetCompiledModel{side}BufferRequirements")(
            compiled, ctypes.c_size_t(0), ctypes.c_size_t(i), ctypes.byref(requirements)), f"{side} requirements")
        _check(lib.LiteRtCreateManagedTensorBufferFromRequirements(env, kind, requirements, ctypes.byref(buffer)),
               f"{side} buffer")
        out.append(buffer)
    return out


def _write(lib: Any, buffer: ctypes.c_void_p, x: np.ndarray) -> None:
    host = ctypes.c_void_p()
    _check(lib.LiteRtLockTensorBuffer(buffer, ctypes.byref(host), _WRITE), "lock input")
    ctypes.memmove(host, np.ascontiguousarray(x).ctypes.data, x.nbytes)
    _check(lib.LiteRtUnlockTensorBuffer(buffer), "unlock input")


class _Event(ctypes.Structure):
    """``ProfiledEventData`` (litert/c/litert_profiler_event.h)."""

    _fields_ = [("tag", ctypes.c_char_p), ("event_type", ctypes.c_int), ("start_us", ctypes.c_uint64),
                ("elapsed_us", ctypes.c_uint64), ("begin_mem", ctypes.c_size_t * 3), ("end_mem", ctypes.c_size_t * 3),
                ("metadata1", ctypes.c_uint64), ("metadata2", ctypes.c_uint64), ("source", ctypes.c_int)]


# Event types of one op's invocation (LiteRtProfilerEventType): an op LiteRT runs itself, and an
# XNNPACK operator inside the delegate (metadata1: its node index)
_OP_EVENTS = (1 << 1, 1 << 2, 1 << 3)


def op_events(path: Path, x: np.ndarray, threads: int, runs: int) -> list[tuple[str, int, float]]:
    """Every op invocation of ``runs`` profiled inferences of ``x`` (after one unprofiled warm-up run),
    as (op type, node index, ms), in the order they ran."""
    lib, keep = _library(), []
    env, model, options, compiled = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib.LiteRtCreateEnvironment(0, None, ctypes.byref(env)), "environment")
    _check(lib.LiteRtCreateModelFromFile(env, str(path).encode(), ctypes.byref(model)), f"model {path}")
    _check(lib.LiteRtCreateOptions(ctypes.byref(options)), "options")
    _check(lib.LiteRtSetOptionsHardwareAccelerators(options, _CPU), "CPU accelerator")
    for identifier, toml in ((b"runtime_options_string", b"enable_profiling = true\n"),
                             (b"xnnpack", f"num_threads = {threads}\n".encode())):
        _check(lib.LiteRtAddOpaqueOptions(options, _opaque(lib, identifier, toml, keep)), identifier.decode())
    _check(lib.LiteRtCreateCompiledModel(env, model, options, ctypes.byref(compiled)), "compiled model")
    lib.LiteRtDestroyOptions(options)
    buffers: list[ctypes.c_void_p] = []
    try:
        inputs, outputs = (_buffers(lib, env, model, compiled, side) for side in ("Input", "Output"))
        buffers += inputs + outputs
        _write(lib, inputs[0], x.astype(np.float32))
        arrays = [(ctypes.c_void_p * len(b))(*b) for b in (inputs, outputs)]

        def run() -> None:
            _check(lib.LiteRtRunCompiledModel(compiled, ctypes.c_size_t(0), ctypes.c_size_t(len(inputs)), arrays[0],
                                              ctypes.c_size_t(len(outputs)), arrays[1]), "run")

        profiler = ctypes.c_void_p()
        _check(lib.LiteRtCompiledModelGetProfiler(compiled, ctypes.byref(profiler)), "profiler")
        if not profiler:
            raise RuntimeError("LiteRT gave no profiler although enable_profiling was set")
        run()  # warm-up: XNNPACK packs weights on the first run
        _check(lib.LiteRtResetProfiler(profiler), "reset profiler")
        _check(lib.LiteRtStartProfiler(profiler), "start profiler")
        for _ in range(runs):
            run()
        count = ctypes.c_int()
        _check(lib.LiteRtGetNumProfilerEvents(profiler, ctypes.byref(count)), "event count")
        events = (_Event * count.value)()
        _check(lib.LiteRtGetProfilerEvents(profiler, count, events), "events")
        # The delegate's own node, when reported, spans its operators: counting it would count them twice.
        return [(e.tag.decode(), e.metadata1, e.elapsed_us / 1e3) for e in events
                if e.event_type in _OP_EVENTS and b"Delegate" not in e.tag]
    finally:
        for buffer in buffers:
            lib.LiteRtDestroyTensorBuffer(buffer)
        lib.LiteRtDestroyCompiledModel(compiled)
        lib.LiteRtDestroyModel(model)
        lib.LiteRtDestroyEnvironment(env)


def op_table(path: Path, x: np.ndarray, threads: int, runs: int) -> list[dict[str, Any]]:
    """Per op type, most time first: ms per inference (each of its operators' median over ``runs``
    inferences, summed: on a busy host one preempted run would otherwise dominate a mean) and how
    many operators of that type the runtime ran, ``threads`` XNNPACK threads, by LiteRT's own profiler."""
    per_node: dict[tuple[str, int], list[float]] = {}
    for op, node, ms in op_events(path, x, threads, runs):
        per_node.setdefault((op, node), []).append(ms)
    out: dict[str, dict[str, Any]] = {}
    for (op, _), times in per_node.items():
        row = out.setdefault(op, {"op": op, "ms": 0.0, "operators": 0})
        row["ms"] += float(np.median(times))
        row["operators"] += 1
    return sorted(out.values(), key=lambda r: -r["ms"])


def op_times(path: Path, x: np.ndarray, threads: int, runs: int) -> dict[str, float]:
    """ms per inference spent in each op type (``op_table``), as the other runtimes' profilers give it."""
    return {r["op"]: r["ms"] for r in op_table(path, x, threads, runs)}
