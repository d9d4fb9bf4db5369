#!/usr/bin/env python3
"""hydra-edge calibration runner: times every artefact of a bundle on the device it runs on.

``hydra-edge calibrate`` pushes this file beside the torch-free parts of ``hydra_edge`` it imports
(``runtime``, ``records``, ``errors``, ``atomic``, ``bounds``, ``formats``, ``calibration_plan``) and runs it
with the device's Python (3.9+, numpy, msgspec and the bundle's runtime; never torch). It can also be run by
hand on a board: ``python3 calibration/runner.py --bundle bundles/rpi``.

For each artefact it checks the sha256 of the file and its golden pair, loads it, runs the
golden inputs and refuses to time an artefact whose outputs are outside the manifest's
tolerance (a runtime that computes garbage is reported, not timed), then warms up. It then times
every loaded artefact in rounds (``hydra_edge.calibration_plan``): each round waits until the device
is back in the thermal state it started in, then visits the head counts in a new random order, a
block of single-image inferences each (after ``--block-warmup`` untimed ones), until each head
count's p90 is known to ``--within`` (at least ``--runs`` runs and ``--min-seconds``) or its
``--cap-seconds`` is spent. Everything it learns goes to stdout as one JSON object per line, so the
host can save each block the moment it arrives:

    {"event": "device", "device": {...}, "runtimes": {...}}        first
    {"event": "result", "heads": 6, "status": "error", ...}       an artefact that cannot be timed
    {"event": "loaded", "heads": 6, "artefact": "..."}              one ready to time, or instead
    {"event": "unloaded", "heads": 6, ...}                          memory short: loaded again per block
    {"event": "round", "round": 3, "order": [6, 3], "gate": {...}} before each round
    {"event": "block", "heads": 6, "block": {...}, ...}            each block of runs
    {"event": "result", "heads": 6, "status": "ok", ...}          as each head count's timing stops
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
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the pushed hydra_edge beside us

from hydra_edge.atomic import sha256_file  # noqa: E402
from hydra_edge.bounds import (MAX_CAP_S, MAX_RUNS, MAX_SOAK_S, MAX_THREADS, POLL_S, SOAK_INTERVAL_S,  # noqa: E402
                               WITHIN, number_arg)
from hydra_edge.errors import HydraEdgeError  # noqa: E402
from hydra_edge.records.manifest import ArtefactRecord, read_manifest  # noqa: E402
from hydra_edge.runtime.memory import (MEMORY_FLOOR, available_share, peak_rss_mb, reset_peak_rss,  # noqa: E402
                                       rss_mb)

Emit = Callable[[Dict[str, Any]], None]


def emit(event: Dict[str, Any]) -> None:
    """One JSON line, flushed at once: the host may lose the connection right after it."""
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the host has gone; nothing left to tell anyone
        os._exit(1)


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


def failed(artefact: ArtefactRecord, e: Exception) -> Dict[str, Any]:
    """The result of an artefact the runtime could not run: the exception's first line."""
    said = (str(e).strip().splitlines() or [""])[0]
    return {"event": "result", "heads": artefact.heads, "artefact": artefact.id, "sha256": artefact.sha256,
            "runner": "python", "status": "error", "error": f"{type(e).__name__}: {said}"}


@dataclasses.dataclass
class Loaded:
    """An artefact ready to time: its engine (None while released, see ``Resident``) and input, and its
    result so far (status still ``error``)."""

    artefact: ArtefactRecord
    engine: Any
    x: Any
    result: Dict[str, Any]


class Resident:
    """Which artefacts keep their engines between their blocks.

    The rounds come back to every head count again and again, so each stays loaded: loading it anew for
    each block would add a load (and a compact artefact's rebuild) to every one. A board that cannot
    hold them all (ten head counts of the base model on a 1 GB Pi) would swap, timing the swap, or
    kill the runner; so while the kernel can give less than ``MEMORY_FLOOR`` of the device's memory, the
    least recently timed engine is released (an ``unloaded`` line) and loaded again for its next block:
    its load then counts in that block's time (and so toward its cap), never in its timed runs.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loaded: List[Loaded] = []  # least recently timed first

    def use(self, item: Loaded) -> Any:
        """The item's engine, loaded again if it was released; it becomes the most recently used."""
        from hydra_edge.runtime.rebuild import load_record

        if item.engine is None:
            item.engine = load_record(self.args.bundle, item.artefact, _threads(self.args, item.artefact))
        if item in self.loaded:
            self.loaded.remove(item)
        self.loaded.append(item)
        return item.engine

    def release(self, item: Loaded) -> None:
        item.engine = None
        if item in self.loaded:
            self.loaded.remove(item)
        gc.collect()

    def trim(self) -> None:
        """While memory is short, release the least recently timed engines, never the last one used."""
        while len(self.loaded) > 1:
            share = available_share(self.args.sysfs_root)
            if share is None or share >= MEMORY_FLOOR:
                return
            item = self.loaded[0]
            self.release(item)
            emit({"event": "unloaded", "heads": item.artefact.heads, "artefact": item.artefact.id,
                  "available_share": share})


def prepare(bundle: Path, artefact: ArtefactRecord, args: argparse.Namespace, device: Device,
            baseline_mb: Optional[float]) -> Union[Loaded, Dict[str, Any]]:
    """Integrity, golden check, load (and rebuild) time, warm-up and memory: the artefact ready to time,
    or its result when it cannot be timed.

    Artefacts stay loaded for the rounds (as memory allows, ``Resident``), so its peak memory is what its
    own load and warm-up added to the runner's resident memory, on top of the runner's ``baseline_mb``
    before any was loaded.
    """
    from hydra_edge.records.manifest import golden_files
    from hydra_edge.runtime.engines import check_golden, load_golden_pair
    from hydra_edge.runtime.rebuild import load_timed

    result: Dict[str, Any] = {"event": "result", "heads": artefact.heads, "artefact": artefact.id,
                              "sha256": artefact.sha256, "runner": "python", "status": "error"}
    result["state_before"] = device.state().to_dict()
    for name, want, _ in golden_files(artefact.golden):  # the artefact itself: checked by load_timed
        path = bundle / name
        if not path.is_file() or sha256_file(path) != want:
            result["error"] = f"{name} is missing or its sha256 differs from the manifest; push the bundle again"
            return result
    gc.collect()
    before = rss_mb()
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
    peak = peak_rss_mb()
    own = None if peak is None or before is None or baseline_mb is None else baseline_mb + max(0.0, peak - before)
    result["peak_rss_mb"] = own if own is not None else peak
    return Loaded(artefact, engine, x, result)


def start_gate(args: argparse.Namespace, device: Device, start: Optional[Dict[str, Any]]) -> Any:
    """The thermal gate, holding the state each round must start in: a resumed calibration's recorded one
    (``start``), else the device's state now (before anything is loaded)."""
    from hydra_edge.calibration_plan import Gate, GateRule

    return Gate(GateRule(margin_c=args.gate_margin_c, headroom=args.gate_headroom, max_wait_s=args.gate_max_wait_s,
                         poll_s=args.gate_poll_s), lambda: device.state().to_dict(), time.monotonic, time.sleep,
                start)


def time_rounds(loaded: List[Loaded], args: argparse.Namespace, device: Device, gate: Any,
                resume: Dict[str, Any], resident: Resident) -> None:
    """Time every loaded artefact in interleaved rounds (``calibration_plan``), each round gated on the
    device's thermal state; one ``round`` line per round, a ``block`` line per block, and a ``result``
    line for each head count as soon as its timing stops (its engine is then released)."""
    from hydra_edge.calibration_plan import StopRule, Tally, interleave, timed_block

    rule = StopRule(within=args.within, min_runs=args.runs, min_s=args.min_seconds, cap_s=args.cap_seconds)
    by_heads = {item.artefact.heads: item for item in loaded}
    tallies = {heads: Tally(heads) for heads in by_heads}
    for heads, item in by_heads.items():  # a resumed calibration's blocks so far
        for block in resume.get("blocks", {}).get(item.artefact.id, []):
            tallies[heads].add(block["round"], [v / 1e3 for v in block["latencies_ms"]], block["spent_s"])
        tallies[heads].judge(rule)

    def time_block(heads: int) -> List[float]:
        item = by_heads[heads]
        try:
            engine = resident.use(item)
            latencies = timed_block(lambda: engine.step(item.x), time.perf_counter, args.block_warmup,
                                    args.block_seconds)
        except Exception as e:  # noqa: BLE001 - this artefact cannot run here; the others may
            tallies[heads].stopped = "error"
            emit(failed(item.artefact, e))
            resident.release(item)
            return []
        resident.trim()
        return latencies

    def on_block(tally: Any) -> None:
        item = by_heads[tally.heads]
        if tally.stopped == "error":  # reported as it failed
            return
        emit({"event": "block", "heads": tally.heads, "artefact": item.artefact.id, "sha256": item.artefact.sha256,
              "runner": "python", "block": tally.blocks[-1]})
        if tally.stopped:
            finish(item, tally)

    def finish(item: Loaded, tally: Any) -> None:
        item.result.update(status="ok", latency=tally.latency(), stopped=tally.stopped, blocks=tally.blocks,
                           state_after=device.state().to_dict())
        emit(item.result)
        resident.release(item)  # the rounds go on without it

    for heads, tally in tallies.items():  # resumed with enough already
        if tally.stopped:
            finish(by_heads[heads], tally)
    interleave(tallies, time_block, rule, time.monotonic, random.Random(args.seed), gate,
               first_round=int(resume.get("first_round", 1)), on_round=lambda r: emit({"event": "round", **r}),
               on_block=on_block)


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
    parser.add_argument("--runs", type=number_arg(1, MAX_RUNS, integer=True), default=50,
                        help="timed runs per head count at least")
    parser.add_argument("--warmup", type=number_arg(0, MAX_RUNS, integer=True), default=10,
                        help="untimed runs after each artefact loads")
    parser.add_argument("--within", type=number_arg(*WITHIN), default=0.05,
                        help="time each head count until its p90's 95 %% interval is within this share of it")
    parser.add_argument("--min-seconds", type=number_arg(0, MAX_CAP_S), default=1.0,
                        help="timed seconds per head count at least")
    parser.add_argument("--cap-seconds", type=number_arg(0, MAX_CAP_S), default=60.0,
                        help="seconds per head count at most, interval met or not")
    parser.add_argument("--block-seconds", type=number_arg(0, MAX_CAP_S), default=0.25,
                        help="timed seconds per head count per round (at least 5 runs)")
    parser.add_argument("--block-warmup", type=number_arg(0, MAX_RUNS, integer=True), default=2,
                        help="untimed runs before each block (the other head counts ran in between)")
    parser.add_argument("--seed", type=number_arg(0, 2**32, integer=True), default=None,
                        help="the rounds' random order (default: a new one)")
    parser.add_argument("--gate-margin-c", type=number_arg(0, 100), default=2.0,
                        help="a round starts once the hottest sensor is within this of the start's")
    parser.add_argument("--gate-headroom", type=number_arg(0, 10), default=0.7,
                        help="... and Android's headroom forecast at most this (or the start's)")
    parser.add_argument("--gate-max-wait-s", type=number_arg(0, MAX_CAP_S), default=120.0,
                        help="the longest a round waits for the device to cool")
    parser.add_argument("--gate-poll-s", type=number_arg(*POLL_S), default=1.0)
    parser.add_argument("--resume", type=Path, default=None,
                        help="JSON of a calibration's blocks so far ({first_round, blocks: {id: [...]}, gate_start})")
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
    resume = json.loads(args.resume.read_text()) if args.resume else {}
    device = Device(manifest.target.get("signals", {}), args.sysfs_root)
    emit(device_record())
    gate = start_gate(args, device, resume.get("gate_start"))
    loaded, baseline, resident = [], rss_mb(), Resident(args)
    for name in wanted:
        try:
            ready = prepare(args.bundle, known[name], args, device, baseline)
        except Exception as e:  # noqa: BLE001 - this artefact cannot run here; the others may
            ready = failed(known[name], e)
        if isinstance(ready, Loaded):
            loaded.append(ready)
            emit({"event": "loaded", "heads": ready.artefact.heads, "artefact": ready.artefact.id})
            resident.use(ready)
            resident.trim()
        else:
            emit(ready)
    time_rounds(loaded, args, device, gate, resume, resident)
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
