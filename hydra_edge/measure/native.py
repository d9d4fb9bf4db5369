"""Native runners, supplied by the user with ``--runner``: TFLite ``benchmark_model`` and ExecuTorch
``executor_runner`` for devices without Python (phones), TensorRT's ``trtexec`` for a Jetson's ONNX.

The host runs the binary over the transport, once per block of runs in the calibration's rounds
(``native_rounds``), and parses its output with the shared parsers (``runtime.latency``), so a row
from a phone looks like a row from the Python runner. The device state is read the same way: the profile's commands and ``dumpsys`` run over
the transport and their text goes to the same parsers (sysfs files, which the host cannot
open on the device, are replaced by the phone's dumpsys report).

What a native runner cannot do: check the golden pair. ``benchmark_model`` and ``trtexec`` feed
random inputs and ``executor_runner`` ones, so their results say ``golden.checked = false``. Nor can
it rebuild a compact bundle's artefact: it takes a model file, and a phone has no Python to splice
one, so the host rebuilds each (``model_files``: numpy only, its sha256 checked against the
manifest) and pushes the plain file. Its ``rebuild_s`` is then None: no rebuild ran on the device.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Sequence

from ..atomic import write_bytes
from ..errors import HydraEdgeError
from ..formats import FORMATS
from ..records.calibration import HeadResult
from ..records.manifest import ArtefactRecord, bundle_files
from ..runtime.latency import (TFLITE_RUNS_SHOWN, NativeBenchmark, parse_benchmark_model, parse_executor_runner,
                               parse_trtexec, parse_trtexec_times)
from ..runtime.rebuild import rebuild
from ..runtime.signals import DeviceState, android_device_info, parse_getprop, read_state, signals_from_profile
from ..transport import ConnectionLostError, Transport
from .exits import reporting_exit, split_exit

UNCHECKED = {"checked": False, "passed": None,
             "reason": "native runners feed their own inputs; the golden pair was not compared"}


@dataclass(frozen=True)
class NativeTool:
    """One native benchmark program: its command line, its output parser and where its per-run times are
    (which format it runs is the format table's ``native``). A calibration by rounds needs each timed run's
    time for the p90's interval; a tool shows them in its output, in a file it writes, or for at most
    ``most_runs_shown`` runs per invocation."""

    name: str
    # (binary, model, runs, warmup, threads, the artefact's record, a device file for its per-run times)
    argv: Callable[[str, str, int, int, int, ArtefactRecord, str], list[str]]
    parse: Callable[[str], NativeBenchmark]
    most_runs_shown: int | None = None  # None: its output shows every run's time, however many
    warmup_shown: bool = False  # its per-run times begin with its warm-up runs'
    read_times: Callable[[str], list[float] | None] | None = None  # parses the times file argv names


def _benchmark_model(binary: str, model: str, runs: int, warmup: int, threads: int,
                     artefact: ArtefactRecord, times: str) -> list[str]:
    # min_secs / warmup_min_secs 0: exactly the runs asked for, not "at least one second".
    return [binary, f"--graph={model}", f"--num_threads={threads}", f"--num_runs={runs}",
            f"--warmup_runs={warmup}", "--min_secs=0", "--warmup_min_secs=0",
            "--report_peak_memory_footprint=true"]


def _executor_runner(binary: str, model: str, runs: int, warmup: int, threads: int,
                     artefact: ArtefactRecord, times: str) -> list[str]:
    # executor_runner has no warm-up or thread flags: its first iterations are the warm-up, left out of
    # the timings by ``invoke``.
    return [binary, f"--model_path={model}", f"--num_executions={runs + warmup}"]


TRTEXEC_PRECISION = ("--fp16", "--bf16", "--int8", "--fp8", "--best")
TRTEXEC_WARMUP_MS = 200  # trtexec warms up for a time, not a number of runs; this is its own default


def _trtexec(binary: str, model: str, runs: int, warmup: int, threads: int, artefact: ArtefactRecord,
             times: str) -> list[str]:
    # The engine is built with the precision of the profile's trtexec line (``device_build``);
    # --duration=0: exactly the runs asked for, not "at least 3 seconds". The GPU runs it: no thread flag.
    # --exportTimes: each query's timing, which its summary does not give.
    precision = [word for word in (artefact.device_build or "").split() if word in TRTEXEC_PRECISION]
    return [binary, f"--onnx={model}", *precision, f"--iterations={runs}", "--duration=0",
            f"--warmUp={TRTEXEC_WARMUP_MS if warmup else 0}", f"--exportTimes={times}"]


TOOLS: dict[str, NativeTool] = {tool.name: tool for tool in (
    NativeTool("benchmark_model", _benchmark_model, parse_benchmark_model, most_runs_shown=TFLITE_RUNS_SHOWN),
    NativeTool("executor_runner", _executor_runner, parse_executor_runner, warmup_shown=True),
    NativeTool("trtexec", _trtexec, parse_trtexec, read_times=parse_trtexec_times),
)}


def tool_for(fmt: str) -> NativeTool:
    """The native runner of an artefact format (``FORMATS[fmt].native``); one clear line for formats without one."""
    native = FORMATS[fmt].native if fmt in FORMATS else None
    if native not in TOOLS:
        names = ", ".join(f"{f.native} for {f.name}" for f in FORMATS.values() if f.native in TOOLS)
        raise HydraEdgeError(f"no native runner runs {fmt} artefacts (known: {names}); "
                             "calibrate this bundle with the Python runner instead of --runner")
    return TOOLS[native]


@contextmanager
def model_files(bundle: Path, artefacts: Iterable[ArtefactRecord],
                digests: Dict[str, str]) -> Iterator[Dict[str, Path]]:
    """``{artefact file name: local file}`` a native tool can open, while the ``with`` lasts.

    A full artefact is its own file (checked against the manifest by ``bundle_files``); a compact
    one is rebuilt (``runtime.rebuild``: numpy only, the rebuilt bytes' sha256 checked against the
    manifest) into a temporary folder removed afterwards. ``digests`` receives every sha256, so the
    push need not hash the files again.
    """
    artefacts = list(artefacts)
    files = bundle_files(bundle, [a for a in artefacts if a.compact is None], golden=False, digests=digests)
    with tempfile.TemporaryDirectory(prefix="hydra-rebuilt-") as tmp:
        for a in artefacts:
            if a.compact is not None:
                files[a.file] = Path(tmp) / a.file
                write_bytes(files[a.file], rebuild(bundle, a))
                digests[a.file] = a.sha256
        yield files


def remote_signals(profile_signals: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's signals as the host can read them over a transport: commands only.

    Files on the device are out of the host's reach, so temperature and battery come from the
    phone's own report (``dumpsys``) instead; where there is no dumpsys they read as None.
    """
    flat = {**signals_from_profile(profile_signals), **profile_signals}
    for signal in ("thermal", "battery"):
        if flat.get(signal) in (None, "sysfs"):
            flat[signal] = "dumpsys"
    return flat


def remote_runner(transport: Transport) -> Callable[[Sequence[str]], str | None]:
    """A ``read_state`` runner that runs each command on the device: stdout, or None on failure."""
    def run(argv: Sequence[str]) -> str | None:
        result = transport.run(list(argv), check=False, timeout=30)
        return result.stdout if result.ok else None
    return run


def remote_state(transport: Transport, profile_signals: Mapping[str, Any]) -> DeviceState:
    return read_state(remote_signals(profile_signals), run=remote_runner(transport))


def remote_device_info(transport: Transport) -> dict[str, Any]:
    """A phone's identity from ``getprop`` (empty fields where the device has no getprop)."""
    return android_device_info(parse_getprop(remote_runner(transport)(["getprop"]))).to_dict()


def device_cores(transport: Transport) -> int | None:
    """The device's online cores (``nproc``: coreutils, busybox and Android's toybox have it)."""
    text = remote_runner(transport)(["nproc"])
    return int(text) if text and text.strip().isdigit() and int(text) > 0 else None


@dataclass(frozen=True)
class NativeRun:
    """One invocation of a native tool: what it printed, each timed run's time (ms; None where its output
    does not show them), or why it failed (one line)."""

    parsed: NativeBenchmark
    latencies_ms: list[float] | None
    error: str | None


def invoke(transport: Transport, tool: NativeTool, binary: str, model: str, artefact: ArtefactRecord,
           runs: int, warmup: int, threads: int, log: Callable[[str], None]) -> NativeRun:
    """Run the binary at ``binary`` once on ``model`` (both paths on the device); everything it prints also
    goes to ``log`` line by line (its report is where a failed run says why)."""
    times = f"{model}.times.json"  # beside the model, in the bundle's folder on the device
    with transport.stream(reporting_exit(tool.argv(binary, model, runs, warmup, threads, artefact, times)),
                          check=False, on_stderr=log) as lines:
        said = list(lines)  # the stream holds the binary's stdin open: when it ends, the binary is stopped
    stdout, returncode = split_exit("\n".join(said))
    for line in stdout.splitlines():
        log(line)
    stderr = lines.stderr
    if returncode is None:  # the device's shell never said how the binary ended: the link dropped
        raise ConnectionLostError(f"the connection to {transport.device_id} dropped while {tool.name} "
                                  f"timed {artefact.heads} heads")
    parsed = tool.parse(stdout + "\n" + stderr)
    if returncode != 0 or not parsed.succeeded or parsed.latency is None:
        last = (stderr.strip() or stdout.strip()).splitlines()
        return NativeRun(parsed, None, f"{tool.name} exited with {returncode}: {last[-1] if last else 'no output'}")
    each = parsed.latencies_ms
    if tool.read_times is not None:
        written = transport.run(["cat", times], check=False, timeout=30)
        transport.run(["rm", "-f", times], check=False, timeout=30)  # the bundle's folder holds only the bundle
        each = tool.read_times(written.stdout) if written.ok else None
    elif each is not None and tool.warmup_shown:
        each = each[warmup:]
    return NativeRun(parsed, each or None, None)


def head_result(tool: NativeTool, artefact: ArtefactRecord, run: NativeRun | None, before: DeviceState | None,
                after: DeviceState | None) -> HeadResult:
    """A head count's record from a native run: its start-up costs and memory, the golden pair unchecked;
    its latency the run's own statistics (a calibration by rounds puts its tally's in their place; None: no
    invocation in this run, a resumed head count's blocks were enough)."""
    head = HeadResult(heads=artefact.heads, artefact=artefact.id, sha256=artefact.sha256, status="ok",
                      runner=tool.name, golden=dict(UNCHECKED), state_before=before and before.to_dict(),
                      state_after=after and after.to_dict())
    if artefact.compact is not None:
        head.rebuild_s = None  # rebuilt on the host and pushed as a file: no rebuild ran on the device
    if run is None:
        return head
    if run.error is not None:
        head.status, head.error = "error", run.error
        return head
    head.latency = asdict(run.parsed.latency)
    head.load_s = run.parsed.init_ms / 1e3 if run.parsed.init_ms is not None else None
    head.peak_rss_mb = run.parsed.memory_peak_mb
    return head


def run_native(transport: Transport, tool: NativeTool, binary: str, model: str, artefact: ArtefactRecord,
               runs: int, warmup: int, threads: int, profile_signals: Mapping[str, Any],
               log: Callable[[str], None]) -> HeadResult:
    """Time one artefact in one invocation, with the device's state before and after (a soak's sample)."""
    before = remote_state(transport, profile_signals)
    run = invoke(transport, tool, binary, model, artefact, runs, warmup, threads, log)
    return head_result(tool, artefact, run, before, remote_state(transport, profile_signals))


def soak_sample(result: HeadResult, t_s: float) -> dict[str, Any]:
    """One sustained-load sample from a native run: its mean latency and the state after it."""
    state = DeviceState.from_dict(result.state_after or {"timestamp": 0.0})
    return {"heads": result.heads, "t_s": t_s, "latency_ms": result.latency["mean_ms"] if result.latency else None,
            "max_temp_c": state.max_temp_c, "android_thermal_status": state.android_thermal_status_name,
            "throttled": None if state.throttling is None else state.throttling.any_now,
            "battery": state.battery_capacity}
