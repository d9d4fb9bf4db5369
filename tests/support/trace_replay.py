"""A scripted phone run through both switchers: Python's ``Switcher`` and the Kotlin library's ``TraceReplay``.

A trace (JSON: the hand-written ones under apps/android-demo/core/src/test/resources/traces/, and the
generated ones of ``support.trace_gen``) scripts a phone step by step: clock, thermal status and headroom,
battery level and status (unreadable, NaN and out-of-range values included), inference latencies,
restarts and spoiled latency corrections. ``PythonReplay`` runs it through the real ``Switcher``, its
signal readers fed by a fake ``dumpsys`` (``Phone``), a fake clock and timer, and engines that only take
the scripted time; ``kotlin_batch`` runs many traces through ``TraceReplay`` on the built jar in one JVM.
Each gives one line per poll and inference: the head count and the reason of the switch it made.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from support.tables import PHONE_SIGNALS, lut_document

from hydra_edge.runtime import switcher as switcher_module
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.switcher import Switcher

IMAGE = np.zeros((1, 1, 8, 8), np.float32)
Line = Dict[str, Any]  # {"op": "poll" | "infer" | "restart", "heads": int | None, "reason": str | None}


def java_float(value: float) -> str:
    """``Float.toString`` as ``cmd thermalservice headroom`` prints it (NaN, Infinity, 1.0E-5, 0.53)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}E{int(exponent)}" if exponent else text


def scripted(value: Any) -> float:
    """A scripted number: a number, or "nan", "inf", "-inf" (JSON has no spelling for them)."""
    return float(value)


class Phone:
    """``dumpsys thermalservice``, ``cmd thermalservice headroom 10`` and ``dumpsys battery`` as the trace
    says the phone reports now: a null status or level is a dump without it (the command failed); a null
    headroom is the HAL's ``Error:`` answer, "nan" a printed NaN; the rest is printed as Android does."""

    def __init__(self) -> None:
        self.reading: Dict[str, Any] = {}

    def run(self, argv: List[str]) -> Optional[str]:
        if list(argv[:3]) == ["cmd", "thermalservice", "headroom"]:
            headroom = self.reading.get("headroom")
            return "Error: thermal HAL is not ready\n" if headroom is None else \
                f"Headroom in {argv[3]} seconds: {java_float(scripted(headroom))}\n"
        if "thermalservice" in argv:
            status = self.reading.get("status")
            return None if status is None else f"IsStatusOverride: false\nThermal Status: {status}\n"
        if "battery" in argv:
            level, status = self.reading.get("level"), self.reading.get("battery_status")
            if level is None:
                return None
            return "Current Battery Service state:\n  AC powered: false\n" + \
                (f"  status: {status}\n" if status is not None else "") + f"  level: {level}\n"
        return None


class Fake:
    """A clock the replay sets by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class PythonReplay:
    """The trace through ``hydra_edge.runtime.switcher.Switcher``, as TraceReplay runs it through the library."""

    def __init__(self, trace: Dict[str, Any], bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trace, self.bundle = trace, bundle
        self.clock, self.wall, self.timer = Fake(trace.get("clock", 1000.0)), Fake(trace.get("wall", 1.75e9)), Fake(0.0)
        self.phone = Phone()
        self.took = 0.0
        self.advance = False
        self.out: List[Line] = []
        replay = self

        class Engine:  # runs in no time but the scripted one
            def run(self, x: np.ndarray) -> np.ndarray:
                replay.timer.now = replay.took / 1e3
                if replay.advance:
                    replay.clock.now += replay.took / 1e3
                return np.zeros((len(x), 10), np.float32)

        monkeypatch.setattr(switcher_module, "load_record", lambda bundle, record, threads: Engine())
        self.sw = self.open()

    def open(self) -> Switcher:
        # the profile names headroom, as targets/android.toml does; it counts only where the table does too
        # (a trace's "signals": {"headroom": false} is a phone that does not read it, as an app on API < 30)
        signals = {**PHONE_SIGNALS, **{k: v for k, v in self.trace.get("signals", {}).items() if v is not None}}
        loop = self.trace.get("loop")
        return Switcher(self.bundle, signals=signals, run=self.phone.run, clock=self.clock, timer=self.timer,
                        wall_clock=self.wall, prefetch=False,
                        latency_loop=None if loop is None else LoopSettings(**loop))

    def emit(self, op: str, heads: Optional[int], before: int) -> None:
        reason = self.sw.events[-1].reason if self.sw.switches > before else None
        self.out.append({"op": op, "heads": heads, "reason": reason})

    def poll(self, reading: Dict[str, Any]) -> None:
        self.phone.reading = reading
        before = self.sw.switches
        self.emit("poll", self.sw.poll(), before)

    def infer(self, ms: float, advance: bool) -> None:
        before = self.sw.switches
        self.took, self.advance, self.timer.now = ms, advance, 0.0
        self.sw.predict(IMAGE)
        self.emit("infer", self.sw.heads, before)

    def serve(self, o: Dict[str, Any]) -> None:
        reading, rate, every = o["reading"], o.get("rate_hz", 10.0), o.get("poll_every_s", 1.0)
        factor, ms = o.get("factor", 1.0), o.get("ms", {})
        end = self.clock.now + o["seconds"]
        next_poll = self.clock.now
        while self.clock.now < end:
            if self.clock.now >= next_poll:
                self.poll(reading)
                next_poll += every
            frame = self.clock.now
            heads = self.sw.heads
            took = float(ms[str(heads)]) if str(heads) in ms else self.sw.table.candidate(heads).latency_ms * factor
            self.infer(took, advance=True)
            self.clock.now = max(self.clock.now, frame + 1 / rate)

    def spoil(self, how: str) -> None:
        """Spoil the saved correction as TraceReplay does: an edit needs a correction there to edit (a JSON
        object with something learned), a folder put in its place stays until "delete"."""
        self.sw.wait_prefetch()  # the correction is written on the loader thread
        path = self.bundle / "lut.correction.json"
        if path.is_dir():
            if how == "delete":
                path.rmdir()
            return
        text = path.read_text() if path.is_file() else ""

        def edit(change: Callable[[Dict[str, Any]], None]) -> None:
            try:
                doc = json.loads(text)
            except ValueError:
                return
            if isinstance(doc, dict) and doc.get("learned"):
                change(doc)
                path.write_text(json.dumps(doc))

        spoils: Dict[str, Callable[[], None]] = {
            "damaged": lambda: path.write_text("{not json"),
            "truncated": lambda: path.write_text(text[:len(text) // 2]),
            "foreign_lut": lambda: edit(lambda d: d.update(lut_sha256="0" * 64)),
            "foreign_manifest": lambda: edit(lambda d: d.update(manifest_sha256="f" * 64)),
            "future": lambda: edit(lambda d: d.update(saved_at=self.wall.now + 60)),
            "unknown_heads": lambda: edit(lambda d: d["learned"][0].update(heads=7)),
            "negative_p90": lambda: edit(lambda d: d["learned"][0].update(p90_ms=-1.0)),
            "unknown_field": lambda: edit(lambda d: d.update(extra=1)),
            "folder": lambda: (path.unlink(missing_ok=True), path.mkdir()),
            "delete": lambda: path.unlink(missing_ok=True),
        }
        spoils[how]()

    def run(self, steps: List[Dict[str, Any]]) -> None:
        for step in steps:
            if "t" in step:
                self.clock.now = float(step["t"])
            if "dt" in step:
                self.clock.now += step["dt"]
            if "wall_dt" in step:
                self.wall.now += step["wall_dt"]
            if "repeat" in step:
                for _ in range(step["repeat"]):
                    self.run(step["steps"])
            elif "poll" in step:
                self.poll(step["poll"])
            elif "infer" in step:
                self.infer(scripted(step["infer"]), advance=False)
            elif "serve" in step:
                self.serve(step["serve"])
            elif "restart" in step:
                self.sw.close()
                self.sw = self.open()
                self.emit("restart", None, self.sw.switches)
            elif "spoil_correction" in step:
                self.spoil(step["spoil_correction"])
        self.sw.wait_prefetch()


def replay_python(trace: Dict[str, Any], bundle: Path, monkeypatch: pytest.MonkeyPatch) -> List[Line]:
    """The trace's lines from Python's switcher, closed at the end."""
    replay = PythonReplay(trace, bundle, monkeypatch)
    try:
        replay.run(trace["steps"])
    finally:
        replay.sw.close()
    return replay.out


def kind(reason: Optional[str]) -> Optional[str]:
    """A fallback's reason names lut.json's path, which differs between the two copies: compare its kind."""
    return "fallback" if reason is not None and reason.startswith("fallback: ") else reason


def spoil_lut(bundle: Path, how: Optional[str]) -> None:
    """Spoil a bundle's lut.json as a trace's ``lut_spoil`` says (both copies the same way)."""
    if how is None:
        return
    lut = bundle / "lut.json"
    doc = json.loads(lut.read_text())
    if how == "damaged":
        lut.write_text("{not json")
    elif how == "foreign_manifest":
        lut.write_text(json.dumps({**doc, "bundle": {**doc["bundle"], "manifest_sha256": "e" * 64}}))
    elif how == "hotter_cell_with_more_heads":
        doc["selection"]["cells"][0][1] = len(doc["candidates"]) - 1
        doc["selection"]["cells"][0][0] = 0
        lut.write_text(json.dumps(doc))
    elif how == "temperature_source":
        doc["thermal"].update(source="temperature", headroom=False)
        lut.write_text(json.dumps(doc))
    else:
        raise AssertionError(f"unknown lut spoil {how}")


def bundles_for(trace: Dict[str, Any], folder: Path) -> Tuple[Path, Path]:
    """Two copies of the bundle the trace's table makes (one a side: each writes its own correction)."""
    source = lut_document(folder / "made", trace["table"])
    python_bundle, kotlin_bundle = folder / "python", folder / "kotlin"
    for copy in (python_bundle, kotlin_bundle):
        shutil.copytree(source, copy)
        spoil_lut(copy, trace.get("lut_spoil"))
    return python_bundle, kotlin_bundle


def kotlin_batch(classpath: str, runs: Sequence[Tuple[Path, Path]], folder: Path) -> List[Dict[str, Any]]:
    """Each (trace file, bundle) through TraceReplay in one JVM: ``{"out": [lines]}`` or ``{"error": why}``."""
    listing = folder / "runs.tsv"
    listing.write_text("".join(f"{trace}\t{bundle}\n" for trace, bundle in runs))
    done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.TraceReplay", "--batch", str(listing)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(runs), (len(results), len(runs))
    return results


def first_difference(python: List[Line], kotlin: List[Line]) -> Optional[str]:
    """Where the two sides' lines first differ (head count, or reason by kind), or None when they agree."""
    for i, (p, k) in enumerate(zip(python, kotlin)):
        if (k["op"], k["heads"], kind(k["reason"])) != (p["op"], p["heads"], kind(p["reason"])):
            return f"line {i}: Kotlin {k}, Python {p}"
    if len(python) != len(kotlin):
        return f"Kotlin gave {len(kotlin)} lines, Python {len(python)}"
    return None
