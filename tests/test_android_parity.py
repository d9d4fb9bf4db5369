"""The Android switcher library (apps/android-demo/core, Kotlin on a plain JVM) decides as the board's
Python switcher does: proved on shared traces, not on hand-written expectations.

Each trace (apps/android-demo/core/src/test/resources/traces/*.json) scripts a phone step by step:
clock, thermal status and headroom, battery level and status (unreadable, NaN and out-of-range
values included), inference latencies, restarts and spoiled latency corrections. This test runs
it through Python's real ``Switcher`` (its signal readers fed by a fake ``dumpsys``, a fake clock and
timer, engines that only take the scripted time) and through the Kotlin ``TraceReplay`` on the built
jar, and asserts the same head count and the same switch reason at every poll and inference. The
same lut.json mutations are refused by both readers, at the same field. The Maven project is built
here (its own JUnit tests included), offline once install.sh has fetched its dependencies.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
from support.kotlin import CORE
from support.tables import PHONE_SIGNALS, lut_document

from hydra_edge.runtime import switcher as switcher_module
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.signals import read_state
from hydra_edge.runtime.switcher import Switcher

pytestmark = pytest.mark.slow  # builds and tests the Kotlin library with Maven (about a minute)

TRACES = CORE / "src" / "test" / "resources" / "traces"
IMAGE = np.zeros((1, 1, 8, 8), np.float32)


# -- the Kotlin side ----------------------------------------------------------------------------------

def kotlin_replay(classpath: str, trace: Path, bundle: Path) -> List[Dict[str, Any]]:
    done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.TraceReplay", str(trace), str(bundle)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


# -- the Python side ----------------------------------------------------------------------------------

def java_float(value: float) -> str:
    """``Float.toString`` as ``cmd thermalservice headroom`` prints it (NaN, 1.0E-5, 0.53)."""
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}E{int(exponent)}" if exponent else text


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
                f"Headroom in {argv[3]} seconds: {java_float(float(headroom))}\n"
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
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def latency(value: Any) -> float:
    return float(value)  # "nan", "inf", "-inf" as strings: JSON has no spelling for them


class PythonReplay:
    """The trace through ``hydra_edge.runtime.switcher.Switcher``, as TraceReplay runs it through the library."""

    def __init__(self, trace: Dict[str, Any], bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trace, self.bundle = trace, bundle
        self.clock, self.wall, self.timer = Fake(trace.get("clock", 1000.0)), Fake(trace.get("wall", 1.75e9)), Fake(0.0)
        self.phone = Phone()
        self.took = 0.0
        self.out: List[Dict[str, Any]] = []
        replay = self

        class Engine:  # runs in no time but the scripted one
            def __init__(self, advance: bool) -> None:
                self.advance = advance

            def run(self, x: np.ndarray) -> np.ndarray:
                replay.timer.now = replay.took / 1e3
                if replay.advance:
                    replay.clock.now += replay.took / 1e3
                return np.zeros((len(x), 10), np.float32)

        self.advance = False
        monkeypatch.setattr(switcher_module, "load_record", lambda bundle, record, threads: Engine(True))
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
        reason = self.sw.events[-1].reason if len(self.sw.events) > before else None
        self.out.append({"op": op, "heads": heads, "reason": reason})

    def poll(self, reading: Dict[str, Any]) -> None:
        self.phone.reading = reading
        before = len(self.sw.events)
        self.emit("poll", self.sw.poll(), before)

    def infer(self, ms: float, advance: bool) -> None:
        before = len(self.sw.events)
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
        self.sw.wait_prefetch()  # the correction is written on the loader thread
        path = self.bundle / "lut.correction.json"
        text = path.read_text() if path.is_file() else ""

        def edit(change: Callable[[Dict[str, Any]], None]) -> None:
            doc = json.loads(text)
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
            "folder": lambda: (path.unlink(), path.mkdir()),
            "delete": lambda: path.rmdir() if path.is_dir() else path.unlink(missing_ok=True),
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
                self.infer(latency(step["infer"]), advance=False)
            elif "serve" in step:
                self.serve(step["serve"])
            elif "restart" in step:
                self.sw.close()
                self.sw = self.open()
                self.emit("restart", None, len(self.sw.events))
            elif "spoil_correction" in step:
                self.spoil(step["spoil_correction"])
        self.sw.wait_prefetch()


def kind(reason: Optional[str]) -> Optional[str]:
    """A fallback's reason names lut.json's path, which differs between the two copies: compare its kind."""
    return "fallback" if reason is not None and reason.startswith("fallback: ") else reason


def spoil_lut(bundle: Path, how: Optional[str]) -> None:
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
    else:
        raise AssertionError(f"unknown lut spoil {how}")


TRACE_FILES = sorted(TRACES.glob("*.json"))


def test_there_are_traces_for_every_rule() -> None:
    """Each rule the library mirrors is scripted by some trace (named in its "covers")."""
    covered = {rule for path in TRACE_FILES for rule in json.loads(path.read_text())["covers"]}
    rules = {"bands", "hysteresis", "dwell", "stale", "unknown thermal status", "headroom nan", "unreadable battery",
             "battery out of range", "assumed_hot", "raise_after", "latency down", "probe up", "probe fails",
             "switch rate", "absurd timings", "battery budget", "correction save and restore", "correction expired",
             "correction refused", "lut refused", "headroom severe", "headroom failed held then safe",
             "headroom recovery", "headroom not named"}
    assert rules <= covered, f"no trace covers {sorted(rules - covered)}"


@pytest.mark.parametrize("path", TRACE_FILES, ids=[p.stem for p in TRACE_FILES])
def test_kotlin_decides_as_python_at_every_step(path: Path, classpath: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = json.loads(path.read_text())
    source = lut_document(tmp_path / "made", trace["table"])
    python_bundle, kotlin_bundle = tmp_path / "python", tmp_path / "kotlin"
    for copy in (python_bundle, kotlin_bundle):
        shutil.copytree(source, copy)
        spoil_lut(copy, trace.get("lut_spoil"))
    replay = PythonReplay(trace, python_bundle, monkeypatch)
    try:
        replay.run(trace["steps"])
    finally:
        replay.sw.close()
    python = replay.out
    kotlin = kotlin_replay(classpath, path, kotlin_bundle)
    assert len(python) > 0 and len(kotlin) == len(python), (len(kotlin), len(python))
    for i, (p, k) in enumerate(zip(python, kotlin)):
        assert (k["op"], k["heads"], kind(k["reason"])) == (p["op"], p["heads"], kind(p["reason"])), \
            f"{path.name} line {i}: Kotlin {k}, Python {p}"
    # the trace must exercise what it claims: a switch at all, and each expected reason kind
    reasons = [p["reason"] for p in python if p["reason"]]
    for expected in trace.get("expect_reasons", []):
        assert any(expected in r for r in reasons), f"{path.name}: no switch reason contains {expected!r}: {reasons}"


def test_a_thermal_status_outside_none_to_shutdown_is_no_reading_on_a_board_too() -> None:
    """What TraceReplay's phone and the library assume of the board's reader: -1 or 7 is garbage, not a band."""
    for status in (-1, 7, 99):
        state = read_state({"thermal": "dumpsys"}, run=lambda argv, s=status: f"Thermal Status: {s}\n")
        assert state.android_thermal_status is None and "is not one of NONE..SHUTDOWN" in state.errors["thermal"]
    assert read_state({"thermal": "dumpsys"}, run=lambda argv: "Thermal Status: 6\n").android_thermal_status == 6
