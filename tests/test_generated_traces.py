"""The device's rules proved by search: generated phone traces through Python's switcher and the Kotlin
library, the same head count and reason at every step, neither side raising, Python's invariants held.

Each trace is drawn by ``support.trace_gen`` from a seeded generator (random tables within the schema,
readings that fail, print NaN or sit on band edges and margins, garbage and equal timings, serving,
restarts, spoiled corrections), replayed through ``Switcher`` with the invariants of
``support.switcher_rules`` checked after every line, and through ``TraceReplay`` in one JVM per batch.
The seeds are fixed, so a failure is reproduced by its seed; a trace that found a defect is kept, shrunk,
among the named traces (apps/android-demo/core/src/test/resources/traces/regression_*.json), which
tests/test_android_parity.py replays. Both tests start a JVM (the library is built first), so both are in
the slow tier: a few hundred traces and thousands more; the inner loop keeps Python's rules by Hypothesis
(tests/test_switcher_rules.py).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from support import trace_gen
from support.switcher_rules import replay_checked
from support.trace_replay import Line, bundles_for, first_difference, kotlin_batch

FAST, SLOW = range(0, 200), range(200, 3200)


def divergences(seeds: range, classpath: str, folder: Path) -> List[str]:
    """Every seed whose trace made either side raise, broke an invariant, or made the two disagree."""
    runs: List[Tuple[Path, Path]] = []
    python: Dict[int, List[Line]] = {}
    found: List[str] = []
    for seed in seeds:
        trace = trace_gen.trace(random.Random(seed))
        here = folder / str(seed)
        here.mkdir()
        (here / "trace.json").write_text(json.dumps(trace))
        python_bundle, kotlin_bundle = bundles_for(trace, here)
        try:
            python[seed] = replay_checked(trace, python_bundle)
        except Exception as e:  # noqa: BLE001 - an invariant broken or the switcher raising: both are findings
            found.append(f"seed {seed}: Python: {type(e).__name__}: {str(e)[:300]}")
        runs.append((here / "trace.json", kotlin_bundle))
    for seed, kotlin in zip(seeds, kotlin_batch(classpath, runs, folder)):
        if "error" in kotlin:
            found.append(f"seed {seed}: Kotlin threw {kotlin['error'][:300]}")
        elif seed in python:
            difference = first_difference(python[seed], kotlin["out"])
            if difference is not None:
                found.append(f"seed {seed}: {difference}")
    return found


@pytest.mark.slow  # starts a JVM
def test_a_few_hundred_generated_traces_agree(classpath: str, tmp_path: Path) -> None:
    found = divergences(FAST, classpath, tmp_path)
    assert not found, f"{len(found)} of {len(FAST)} traces (in {tmp_path}):\n" + "\n".join(found[:10])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 3 min on a quiet 2-core host; the suite's 600 s is for one ordinary test
def test_thousands_of_generated_traces_agree(classpath: str, tmp_path: Path) -> None:
    found = divergences(SLOW, classpath, tmp_path)
    assert not found, f"{len(found)} of {len(SLOW)} traces (in {tmp_path}):\n" + "\n".join(found[:10])
