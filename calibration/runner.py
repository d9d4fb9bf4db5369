#!/usr/bin/env python3
"""hydra-edge calibration runner: times every artefact of a bundle on the device it runs on.

``hydra-edge calibrate`` pushes this file beside the torch-free parts of ``hydra_edge`` it
imports (``runtime``, ``records``, ``errors``, ``atomic``, ``bounds``, ``formats``) and runs it with the
device's Python (3.9+, numpy, msgspec and the bundle's runtime; never torch). It can also be run by
hand on a board: ``python3 calibration/runner.py --bundle bundles/rpi``.

For each artefact it checks the sha256 of the file and its golden pair, loads it, runs the
golden inputs and refuses to time an artefact whose outputs are outside the manifest's
tolerance (a runtime that computes garbage is reported, not timed), then warms up and times
``--runs`` single-image inferences. Everything it learns goes to stdout as one JSON object
per line, so the host can save each head count the moment it arrives:

    {"event": "device", "device": {...}, "runtimes": {...}}        first
    {"event": "result", "heads": 6, "status": "ok", ...}          one per artefact
    {"event": "soak", "t_s": 12.0, "latency_ms": 3.1, ...}        with --soak-seconds
    {"event": "done"}                                              last
    {"event": "fatal", "message": "..."}                           instead, when it cannot go on

It does not watch for its host itself: the calibrator starts it under a device shell that stops it
when the host goes away (Ctrl-C, a killed host, a dropped link; ``hydra_edge.measure.exits``), the
same way for ssh, adb and this machine, and for native benchmark binaries alike.
"""

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the pushed hydra_edge beside us

from hydra_edge.atomic import sha256_file  # noqa: E402
from hydra_edge.bounds import MAX_RUNS, MAX_SOAK_S, MAX_THREADS, SOAK_INTERVAL_S, number_arg  # noqa: E402
from hydra_edge.errors import HydraEdgeError  # noqa: E402
from hydra_edge.records.manifest import ArtefactRecord, read_manifest  # noqa: E402

Emit = Callable[[Dict[str, Any]], None]


def emit(event: Dict[str, Any]) -> None:
    """One JSON line, flushed at once: the host may lose the connection right after it."""
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the host has gone; nothing left to tell anyone
        os._exit(1)


def peak_rss_mb() -> Optional[float]:
    """Peak resident memory since the last ``reset_peak_rss`` (Linux VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux
    except (ImportError, OSError):
        return None


def reset_peak_rss() -> None:
    """Start a new peak for the next artefact (writing 5 to clear_refs resets VmHWM, Linux 4.0+)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the peak then covers every artefact so far; still an upper bound


class Device:
    """The signals this device's target profile names, read under ``root``."""

    def __init__(self, signals: Dict[str, Any], root: str) -> None:
        from hydra_edge.runtime.signals import read_state

        self._read, self.signals, self.root = read_state, signals, root

    def state(self) -> Any:
        return self._read(self.signals, self.root)


def _timed_runs(step: Callable[[Any], Any], x: Any, n: int) -> List[float]:
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        step(x)
        latencies.append(time.perf_counter() - start)
    return latencies


def _threads(args: argparse.Namespace, artefact: ArtefactRecord) -> int:
    """As asked (else the target's), but never more than this device's cores, as the switcher does."""
    return min(args.threads or artefact.threads, os.cpu_count() or 1)


def measure(bundle: Path, artefact: ArtefactRecord, args: argparse.Namespace, device: Device) -> Dict[str, Any]:
    """One artefact: integrity, golden check, load (and rebuild) time, latency statistics, memory, state."""
    from hydra_edge.records.manifest import golden_files
    from hydra_edge.runtime.engines import check_golden, load_golden_pair
    from hydra_edge.runtime.rebuild import load_timed
    from hydra_edge.runtime.latency import summarize_latencies

    result: Dict[str, Any] = {"event": "result", "heads": artefact.heads, "artefact": artefact.id,
                              "sha256": artefact.sha256, "runner": "python", "status": "error"}
    result["state_before"] = device.state().to_dict()
    for name, want, _ in golden_files(artefact.golden):  # the artefact itself: checked by load_timed
        path = bundle / name
        if not path.is_file() or sha256_file(path) != want:
            result["error"] = f"{name} is missing or its sha256 differs from the manifest; push the bundle again"
            return result
    gc.collect()
    reset_peak_rss()
    threads = _threads(args, artefact)
    start = time.perf_counter()
    try:
        engine, rebuild_s = load_timed(bundle, artefact, threads)
    except HydraEdgeError as e:
        result["error"] = str(e)
        return result
    result["load_s"] = time.perf_counter() - start  # the rebuild included
    if rebuild_s is not None:
        result["rebuild_s"] = rebuild_s
    golden = load_golden_pair(bundle, artefact.golden)
    check = check_golden(engine, golden, artefact.golden["tolerance"])
    result["golden"] = {"checked": True, "passed": check.ok, "max_abs_diff": check.max_abs_diff,
                        "top1_agreement": check.top1_agreement, "tolerance": check.tolerance}
    if not check.ok:
        result["status"] = "golden_failed"
        result["error"] = f"outputs outside tolerance, not timed: {check.describe()}"
        return result
    x = golden["inputs"][:1].astype("float32")
    _timed_runs(engine.step, x, args.warmup)
    stats = summarize_latencies(_timed_runs(engine.step, x, args.runs))
    result.update(status="ok", latency=dataclasses.asdict(stats), peak_rss_mb=peak_rss_mb(),
                  state_after=device.state().to_dict())
    return result


def soak(bundle: Path, artefact: ArtefactRecord, args: argparse.Namespace, device: Device) -> None:
    """Run one artefact without pause for ``--soak-seconds``; one sample per ``--soak-interval``.

    Each sample is the median latency of its window and the device state at its end, so the
    host can relate slowdown to temperature, throttling and thermal status.
    """
    from hydra_edge.runtime.engines import load_golden_pair
    from hydra_edge.runtime.rebuild import load_record

    engine = load_record(bundle, artefact, _threads(args, artefact))
    x = load_golden_pair(bundle, artefact.golden)["inputs"][:1].astype("float32")
    start = time.monotonic()
    while time.monotonic() - start < args.soak_seconds:
        window_end = time.monotonic() + args.soak_interval
        latencies: List[float] = []
        while not latencies or time.monotonic() < window_end:
            latencies += _timed_runs(engine.step, x, 1)
        state = device.state()
        throttling = state.throttling
        emit({"event": "soak", "heads": artefact.heads, "t_s": time.monotonic() - start,
              "latency_ms": statistics.median(latencies) * 1e3, "runs": len(latencies),
              "max_temp_c": state.max_temp_c, "throttled": None if throttling is None else throttling.any_now,
              "android_thermal_status": state.android_thermal_status_name,
              "battery": state.battery_capacity})


def device_record() -> Dict[str, Any]:
    """What this device is, and which runtimes it has, for the calibration's device record."""
    import numpy

    from hydra_edge.runtime.engines import installed_runtimes
    from hydra_edge.runtime.signals import read_device_info

    return {"event": "device", "device": read_device_info().to_dict(),
            "runtimes": {**installed_runtimes(), "numpy": numpy.__version__}}


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time a hydra-edge bundle's artefacts on this device.")
    parser.add_argument("--bundle", type=Path, required=True, help="folder holding manifest.json")
    parser.add_argument("--only", nargs="*", default=None, metavar="ID", help="artefact ids to time (default: all)")
    parser.add_argument("--runs", type=number_arg(1, MAX_RUNS, integer=True), default=50)
    parser.add_argument("--warmup", type=number_arg(0, MAX_RUNS, integer=True), default=10)
    parser.add_argument("--threads", type=number_arg(0, MAX_THREADS, integer=True), default=0,
                        help="0: each artefact's target thread count")
    parser.add_argument("--soak-seconds", type=number_arg(0, MAX_SOAK_S), default=0.0)
    parser.add_argument("--soak-artefact", default=None, help="artefact id to soak (default: most heads)")
    parser.add_argument("--soak-interval", type=number_arg(*SOAK_INTERVAL_S), default=5.0,
                        help="seconds per soak sample")
    parser.add_argument("--sysfs-root", default="/", help="read /sys and /proc under this root (tests)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    from hydra_edge.runtime.engines import check_runtimes, runtimes_of

    manifest = read_manifest(args.bundle)
    known = manifest.by_id()
    wanted = list(known) if args.only is None else args.only
    unknown = [name for name in wanted + [args.soak_artefact or ""] if name and name not in known]
    if unknown:
        raise HydraEdgeError(f"{args.bundle}: no artefact {unknown[0]!r} in the manifest")
    # A missing runtime stops the run in one line, instead of an error per artefact and exit 0.
    check_runtimes(runtimes_of(known[name] for name in wanted))
    device = Device(manifest.target.get("signals", {}), args.sysfs_root)
    emit(device_record())
    for name in wanted:
        try:
            emit(measure(args.bundle, known[name], args, device))
        except Exception as e:  # noqa: BLE001 - this artefact cannot run here; the others may
            record, said = known[name], (str(e).strip().splitlines() or [""])[0]
            emit({"event": "result", "heads": record.heads, "artefact": record.id, "sha256": record.sha256,
                  "runner": "python", "status": "error", "error": f"{type(e).__name__}: {said}"})
    if args.soak_seconds > 0:
        target = known[args.soak_artefact] if args.soak_artefact else max(known.values(), key=lambda a: a.heads)
        soak(args.bundle, target, args, device)
    emit({"event": "done"})


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except HydraEdgeError as e:
        emit({"event": "fatal", "message": str(e)})
        return 2
    except ImportError as e:  # numpy or a runtime is missing: say which, in the host's words
        emit({"event": "fatal", "message": f"{e}; install it with pip on the device (or use --setup)"})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
