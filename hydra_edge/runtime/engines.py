"""Device-side artefact runners: one small engine per format, numpy in, numpy out.

This module is what a board or phone runs, so it imports numpy only; each runtime is imported
lazily when its format is loaded. The host's conversion check (``hydra_edge.convert.verify``)
loads artefacts through these same engines, so what was verified is what the device runs.

Each format's entry in ``hydra_edge.formats.FORMATS`` names its loader here (``load_<runtime>``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import io
import shlex
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from ..errors import HydraEdgeError
from ..formats import FORMATS, Format
from ..records.codec import read_bytes
from ..records.manifest import golden_files
from .bundle_files import bundle_bytes

Step = Callable[[np.ndarray], np.ndarray]  # one (1, C, H, W) float32 image -> (1, classes) logits
Model = Union[Path, bytes]  # an artefact file, or its bytes (rebuilt in memory from a compact bundle)


@dataclass
class Engine:
    """A loaded artefact. ``run`` takes a batch and feeds it one image at a time, as the device does."""

    path: Path
    format: Format
    threads: int
    step: Step

    def run(self, x: np.ndarray) -> np.ndarray:
        """Logits (B, classes) float32 for images (B, C, H, W); artefacts are exported for batch 1."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        return np.concatenate([self.step(x[i : i + 1]) for i in range(len(x))]).astype(np.float32)


def load_tflite(model: Model, threads: int, module: str) -> Step:
    # ai-edge-litert, or tflite-runtime for an artefact whose record names it (see hydra_edge.formats.TFLITE_RUNTIME):
    # both packages have the same ``interpreter`` API.
    Interpreter = importlib.import_module(f"{module}.interpreter").Interpreter

    source = {"model_content": model} if isinstance(model, bytes) else {"model_path": str(model)}
    interpreter = Interpreter(**source, num_threads=threads)
    runner = interpreter.get_signature_runner()
    (name,) = interpreter.get_signature_list()["serving_default"]["inputs"]
    return lambda x: next(iter(runner(**{name: x}).values()))


# x86 flags of int8 x int8 -> int32 dot products; without them onnxruntime's int8 kernels use AVX2's
# vpmaddubsw, which adds pairs of u8 x s8 products in 16 bits and saturates
_X86_INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_kernels_saturate(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """Whether onnxruntime's fused int8 kernels saturate on this CPU (x86 without VNNI or AMX).

    onnxruntime documents it: on such CPUs a QDQ model's int8 products may overflow 16-bit
    intermediate sums. Measured on an AVX2-only AMD EPYC (b16, 3 heads, int8 QDQ): logit SQNR
    against the fp16 artefact 16.9 dB with its fused kernels, 26.7 dB with QDQ run as written
    (what TensorRT computes), 14 % slower. Arm CPUs and x86 with VNNI/AMX are not affected.
    ``cpuinfo`` and ``machine`` default to this machine's /proc/cpuinfo and architecture.
    """
    import platform

    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: nothing says which instructions there are; assume the safe path
            return True
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return not any(flag in flags for flag in _X86_INT8_DOT)


@functools.cache
def _this_cpu_saturates() -> bool:
    """``int8_kernels_saturate`` for this machine, read once (an engine is loaded per head count switch)."""
    return int8_kernels_saturate()


def onnx_session_options(threads: int) -> Any:
    """The onnxruntime session options an ONNX engine runs with; its profiler takes them too, so that it
    profiles the graph the engine runs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if _this_cpu_saturates():  # run Q/DQ pairs as written (dequantize, float op), not fused into int8 kernels
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return options


def load_onnx(model: Model, threads: int, module: str) -> Step:
    import onnxruntime as ort

    options = onnx_session_options(threads)
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def load_pte(model: Model, threads: int, module: str) -> Step:
    # executorch's Python bindings take and return torch tensors, so this one engine needs torch
    # (executorch.runtime imports it anyway); the conversion to numpy stays at this boundary.
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    _unsafe_reset_threadpool(threads)
    program = Runtime.get().load_program(model if isinstance(model, bytes) else str(model))
    # A program loaded from bytes reads them in place, and only the Program holds them: the step keeps
    # it (and so the bytes) for as long as its method runs; a method outliving it crashes the process.
    return functools.partial(_run_pte, program, program.load_method("forward"))


def _run_pte(program: Any, method: Any, x: np.ndarray) -> np.ndarray:
    import torch

    return method.execute([torch.from_numpy(x)])[0].numpy()


def format_of(path: str | Path) -> Format:
    """The format of an artefact file, from its suffix."""
    suffix = Path(path).suffix.lower()
    for fmt in FORMATS.values():
        if fmt.suffix == suffix:
            return fmt
    known = ", ".join(f.suffix for f in FORMATS.values())
    raise HydraEdgeError(f"{path}: unknown artefact type {suffix!r}; expected one of {known}")


def load(path: str | Path, threads: int = 1, format: str | None = None, runtime: str | None = None) -> Engine:
    """Load an artefact into its runtime; ``format`` overrides the suffix (for files still being written).

    ``runtime``: the runtime its manifest record names; a format's alternate runtime is used only
    when the record names it (``hydra_edge.formats.Alternate``).
    """
    path = Path(path)
    fmt = _format(format, path)
    if not path.is_file():
        raise HydraEdgeError(f"artefact {path} does not exist")
    return _engine(path, path, fmt, threads, runtime)


def load_bytes(data: bytes | bytearray | memoryview, name: str | Path, threads: int = 1,
               format: str | None = None, runtime: str | None = None) -> Engine:
    """Load an artefact's bytes (rebuilt in memory) into its runtime; ``name`` is the file they are.

    The runtimes take only ``bytes`` (ai-edge-litert's ``model_content`` refuses a bytearray, and
    executorch copies one), so anything else is made ``bytes`` here, once.
    """
    return _engine(data if isinstance(data, bytes) else bytes(data), Path(name), _format(format, name), threads,
                   runtime)


def _format(name: str | None, path: str | Path) -> Format:
    """Format ``name``, or by default the one of ``path``'s suffix."""
    if name is not None and name not in FORMATS:
        raise HydraEdgeError(f"unknown format {name!r}; choose one of {sorted(FORMATS)}")
    return FORMATS[name] if name else format_of(path)


def runtime_module(fmt: Format, runtime: str | None) -> str:
    """The import name of the runtime that runs an artefact of ``fmt`` whose record names ``runtime``.

    The alternate runtime (tflite-runtime) when the record names it and this Python has it: then it
    is what a board with only tflite-runtime runs, and what calibration times there. Otherwise the
    format's own runtime, which runs every artefact of the format (the host verifies in it).
    """
    alt = fmt.alternate
    if alt is not None and runtime == alt.runtime and importlib.util.find_spec(alt.module) is not None:
        return alt.module
    return fmt.module


def _loader(fmt: Format) -> Callable[[Model, int, str], Step]:
    """The function ``fmt.loader`` names: (artefact, threads, import name of the runtime to use) -> step."""
    module, _, name = fmt.loader.partition(":")
    loader: Callable[[Model, int, str], Step] = getattr(importlib.import_module(module), name)
    return loader


def _engine(model: Model, path: Path, fmt: Format, threads: int, runtime: str | None) -> Engine:
    try:
        step = _loader(fmt)(model, max(1, int(threads)), runtime_module(fmt, runtime))
    except ImportError as e:
        # a look-alike runtime this Python has (tflite-runtime) is named, so no one takes it for enough
        alt = fmt.alternate
        note = f" ({alt.why})" if alt and importlib.util.find_spec(alt.module) else ""
        raise HydraEdgeError(f"cannot run {path.name}: {e}{note}; install it with `{pip_install([fmt.runtime])}`"
                             ) from None
    return Engine(path=path, format=fmt, threads=threads, step=step)


def pip_install(packages: Sequence[str], python: str = "python3") -> str:
    """A pip command a user can paste as it is: every word shell-quoted (a bare ``>=`` is a redirect)."""
    return shlex.join([python, "-m", "pip", "install", *packages])


def runtime_version(name: str) -> str | None:
    """Installed version of the runtime of format ``name`` (None if not installed)."""
    try:
        return importlib.metadata.version(FORMATS[name].runtime)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_runtimes() -> dict[str, str]:
    """``{pip name: version}`` of every runtime (alternates included) this Python has: what a
    calibration's device record says the timings ran on."""
    names = [f.runtime for f in FORMATS.values()] + [f.alternate.runtime for f in FORMATS.values() if f.alternate]
    versions = {}
    for name in dict.fromkeys(names):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def impostors(requirements: Mapping[str, str]) -> list[str]:
    """Import names of runtimes that look like, but cannot stand in for, those ``requirements`` need."""
    return [f.alternate.module for f in FORMATS.values() if f.alternate and f.module in requirements]


def lacks(requirements: Mapping[str, str], missing: Sequence[str], present: Sequence[str], python: str,
          where: str) -> str:
    """The start of a one-line error for a Python at ``where`` that lacks ``missing`` import names.

    ``requirements`` maps import names to pip requirements; ``present`` are the impostors it has,
    named so a user does not think the runtime they already installed will do.
    """
    notes = [f.alternate.why for f in FORMATS.values()
             if f.module in missing and f.alternate and f.alternate.module in present]
    return (f"{where} lacks the Python package(s) {' '.join(requirements[m] for m in missing)} for {python!r}"
            + "".join(f" ({note})" for note in notes))


def requirement(format: str, runtime: str, min_version: str) -> tuple[str, str]:
    """(import name, pip requirement) of the runtime an artefact's record names: the format's own
    runtime, or its alternate when the record names that (a tflite-runtime board), at ``min_version``."""
    fmt = FORMATS[format]
    if fmt.alternate is not None and runtime == fmt.alternate.runtime:
        return fmt.alternate.module, f"{runtime}>={min_version}"
    return fmt.module, fmt.runtime + (f">={min_version}" if runtime == fmt.runtime else "")


def runtimes_of(artefacts: Iterable[Any]) -> dict[str, str]:
    """``{import name: pip requirement}`` of the runtimes manifest records (``format``, ``runtime``,
    ``runtime_min_version``) name: what a device must have to run those artefacts."""
    return dict(requirement(a.format, a.runtime, a.runtime_min_version) for a in artefacts)


def check_runtimes(requirements: Mapping[str, str]) -> None:
    """Refuse, in one line, to start without a runtime this Python needs, rather than fail per artefact."""
    missing = [m for m in requirements if importlib.util.find_spec(m) is None]
    if missing:
        present = [m for m in impostors(requirements) if importlib.util.find_spec(m) is not None]
        raise HydraEdgeError(f"{lacks(requirements, missing, present, sys.executable, 'this device')}; install "
                             f"with `{pip_install([requirements[m] for m in missing], sys.executable)}`")


# ---------------------------------------------------------------------------------------------
# Golden pairs: a device checks these before any of its timings count.


@dataclass(frozen=True)
class GoldenCheck:
    """How an engine's outputs on the golden inputs compare with the reference outputs."""

    ok: bool
    max_abs_diff: float
    top1_agreement: float
    tolerance: dict[str, float]

    def describe(self) -> str:
        return (
            f"max |diff| {self.max_abs_diff:.4g} (allowed {self.tolerance['max_abs_diff']:.4g}), "
            f"top-1 agreement {self.top1_agreement:.0%} (needed {self.tolerance['min_top1_agreement']:.0%})"
        )


def compare(outputs: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Largest absolute difference and the fraction of rows with the same arg-max."""
    outputs, reference = np.asarray(outputs, np.float32), np.asarray(reference, np.float32)
    if outputs.shape != reference.shape:
        return float("inf"), 0.0
    diff = float(np.abs(outputs - reference).max()) if outputs.size else 0.0
    agree = float((outputs.argmax(-1) == reference.argmax(-1)).mean()) if outputs.size else 1.0
    return diff, agree


# A golden pair's file: b16's 8 inputs are 4.6 MiB, the outputs KiB; far more than any target asks for.
GOLDEN_MAX_BYTES = 256 << 20
GOLDEN_FIX = "re-run hydra-edge convert"


def _npz(data: bytes, path: Path) -> dict[str, Any]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise HydraEdgeError(f"cannot read golden pair {path}: {e}; {GOLDEN_FIX}") from None


def load_golden(path: str | Path) -> dict[str, Any]:
    """A golden ``.npz``: ``inputs`` (N, C, H, W), ``reference`` (fp32 logits), ``outputs`` (the host's);
    read without blocking and at most ``GOLDEN_MAX_BYTES``, as every bundle file is."""
    path = Path(path)
    return _npz(read_bytes(path, "golden pair", GOLDEN_FIX, max_bytes=GOLDEN_MAX_BYTES), path)


def load_golden_pair(bundle: str | Path, golden: dict[str, Any]) -> dict[str, Any]:
    """A manifest record's golden pair (its ``golden`` table): its file, with the inputs taken from the
    shared file it names when the bundle stores them once. Each file is read once and its sha256 checked
    on the bytes read, so what is compared is what the manifest names."""
    bundle = Path(bundle)
    pair: dict[str, Any] = {}
    for name, sha256, field in golden_files(golden):  # the pair's own file first, then its shared inputs
        read = _npz(bundle_bytes(bundle, name, sha256, field, GOLDEN_MAX_BYTES), bundle / name)
        pair.update(read if field == "golden.file" else {"inputs": read["inputs"]})
    return pair


def check_golden(engine: Engine, golden: dict[str, Any], tolerance: dict[str, float]) -> GoldenCheck:
    """Run the golden inputs and compare with the fp32 reference under the manifest's tolerance."""
    diff, agree = compare(engine.run(golden["inputs"]), golden["reference"])
    ok = diff <= tolerance["max_abs_diff"] and agree >= tolerance["min_top1_agreement"]
    return GoldenCheck(ok=ok, max_abs_diff=diff, top1_agreement=agree, tolerance=dict(tolerance))
