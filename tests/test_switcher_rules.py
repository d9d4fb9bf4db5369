"""The switcher's rules stated as invariants and proved by generation on Python's switcher alone.

Hypothesis draws phone traces (``support.trace_gen``: tables within the schema, readings that fail, go
out of range or sit on band edges, garbage and equal timings, serving, restarts, spoiled corrections) and
``support.switcher_rules`` checks after every poll and inference: never more heads than the hottest
band (or the lowest battery band) allows while a signal has failed past ``stale_after_s``, never more
than the latency cap, at most ``max_switches_per_minute`` changes of the cap a minute, no exception, and
what the loop learned on disk after ``close()``. A failing trace is shrunk by Hypothesis.
"""

from __future__ import annotations

import random
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import trace_gen
from support.switcher_rules import CheckedReplay, replay_checked
from support.tables import lut_document
from support.trace_replay import bundles_for

from hydra_edge.runtime.closed_loop import LatencyLoop
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.latency_governor import Slowdown

GENERATED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@GENERATED
@given(st.randoms(use_true_random=False))
def test_the_switchers_rules_hold_on_any_trace(rng: random.Random) -> None:
    trace = trace_gen.trace(rng)
    with tempfile.TemporaryDirectory() as folder:
        bundle, _ = bundles_for(trace, Path(folder))
        assert replay_checked(trace, bundle)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.floats(0.0, 1e6) | st.sampled_from([13.8, 13.799999999999999, 1e-300, 0.1]), min_size=1,
                max_size=60), st.floats(0.0, 100.0))
def test_a_percentile_is_numpys_and_never_leaves_the_window(timings: list, q: float) -> None:
    """Equal timings above all: their p90 must be them, or the loop's Slowdown finds none at or below it."""
    window = sorted(timings)
    p = percentile(window, q)
    assert p == float(np.percentile(window, q)) and window[0] <= p <= window[-1]
    seen = Slowdown.of(window, 1.0)  # never raises, whatever the window
    assert seen.spread_ms >= 0.0


@pytest.mark.parametrize("ms", [13.799999999999999, 13.8, 0.1, 1e-300])
def test_a_window_of_equal_timings_predicts_without_spread(ms: float) -> None:
    seen = Slowdown.of([ms] * 20, 11.5)
    assert (seen.scale, seen.spread_ms) == (ms / 11.5, 0.0)


def test_what_the_loop_learned_just_before_close_is_on_disk_after_it(tmp_path: Path) -> None:
    """The board's loader thread writes each correction in turn; close() drops what is queued there but must
    not drop a write: learning 12 then 6 heads while the first write is slow, a restart starts from both."""
    table = {"latency_ms": {"3": 10, "6": 20, "9": 30, "12": 40}, "budget_ms": 41}
    trace = {"table": table, "loop": {"window_s": 1.0, "sustain_s": 1.0}, "steps": []}
    bundle = lut_document(tmp_path, table)
    release, writes = threading.Event(), []
    save = LatencyLoop.save

    def slow_first(loop: LatencyLoop, data: bytes) -> None:  # an SD card that stalls on the first write
        writes.append(data)
        if len(writes) == 1:
            release.wait(30)
        save(loop, data)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(LatencyLoop, "save", slow_first)
        replay = CheckedReplay(trace, bundle, monkeypatch)
        # 12 heads at 60 ms, over the 41 ms budget: down to 6 (predicted 30 ms), which takes 45: down to 3
        replay.serve({"seconds": 6, "ms": {"12": 60, "9": 50, "6": 45, "3": 9},
                      "reading": {"status": 0, "level": 90, "battery_status": 3}})
        assert replay.sw.loop is not None and sorted(replay.sw.loop.governor.learned) == [6, 12]
        threading.Timer(0.5, release.set).start()  # the stalled write ends while close() waits for it
        replay.sw.close()
        replay.assert_saved()
