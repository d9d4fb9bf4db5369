"""The Android switcher library (apps/android-demo/core, Kotlin on a plain JVM) decides as the board's
Python switcher does: proved on shared traces, not on hand-written expectations.

Each trace (apps/android-demo/core/src/test/resources/traces/*.json) scripts a phone step by step:
clock, thermal status and headroom, battery level and status (unreadable, NaN and out-of-range
values included), inference latencies, restarts and spoiled latency corrections. This test runs
it through Python's real ``Switcher`` (its signal readers fed by a fake ``dumpsys``, a fake clock and
timer, engines that only take the scripted time) and through the Kotlin ``TraceReplay`` on the built
jar, and asserts the same head count and the same switch reason at every poll and inference
(tests/test_generated_traces.py does the same for thousands of generated traces, and
tests/test_reader_parity.py for the files both readers read). The Maven project is built here (its own
JUnit tests included), offline once install.sh has fetched its dependencies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.kotlin import CORE
from support.trace_replay import bundles_for, first_difference, kotlin_batch, replay_python

from hydra_edge.runtime.signals import read_state

pytestmark = pytest.mark.slow  # builds and tests the Kotlin library with Maven (about a minute)

TRACES = CORE / "src" / "test" / "resources" / "traces"
TRACE_FILES = sorted(TRACES.glob("*.json"))


def test_there_are_traces_for_every_rule() -> None:
    """Each rule the library mirrors is scripted by some trace (named in its "covers")."""
    covered = {rule for path in TRACE_FILES for rule in json.loads(path.read_text())["covers"]}
    rules = {"bands", "hysteresis", "dwell", "stale", "unknown thermal status", "headroom nan", "unreadable battery",
             "battery out of range", "assumed_hot", "raise_after", "latency down", "probe up", "probe fails",
             "switch rate", "absurd timings", "battery budget", "correction save and restore", "correction expired",
             "correction refused", "lut refused", "headroom severe", "headroom failed held then safe",
             "headroom recovery", "headroom not named", "equal timings window", "inference before any poll",
             "restart then inference", "temperature table on a phone"}
    assert rules <= covered, f"no trace covers {sorted(rules - covered)}"


@pytest.mark.parametrize("path", TRACE_FILES, ids=[p.stem for p in TRACE_FILES])
def test_kotlin_decides_as_python_at_every_step(path: Path, classpath: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = json.loads(path.read_text())
    python_bundle, kotlin_bundle = bundles_for(trace, tmp_path)
    python = replay_python(trace, python_bundle, monkeypatch)
    [kotlin] = kotlin_batch(classpath, [(path, kotlin_bundle)], tmp_path)
    assert "error" not in kotlin, kotlin
    assert len(python) > 0
    difference = first_difference(python, kotlin["out"])
    assert difference is None, f"{path.name} {difference}"
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
