"""The latency loop: the governor on a fake clock and scripted timings, then the switcher running it on
a bundle whose engines take scripted times (no conversion: the table needs only the manifest), with
the saved correction across restarts and the fail-safe rules still winning."""

from __future__ import annotations

import json
import logging
import math
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
from support.switcher import Board, Clock
from support.tables import table

from hydra_edge.errors import HydraEdgeError
from hydra_edge.lut.policy import policy_from_dict
from hydra_edge.records import lut as lut_record
from hydra_edge.runtime import switcher as switcher_module
from hydra_edge.runtime.closed_loop import correction_path
from hydra_edge.runtime.latency_governor import LatencyGovernor, LoopSettings, check_budget
from hydra_edge.runtime.switcher import Switcher

# calibrated ms per head count; budget 41 ms: 12 heads when cool on mains (as in test_switcher)
CALIBRATED = {3: 10.0, 6: 20.0, 9: 30.0, 12: 40.0}
BUDGET = 41.0
SETTINGS = LoopSettings()
RATE_HZ = 10.0  # inferences a second
SIGNALS = {"files": {"temperature_mC": "/sys/class/thermal/thermal_zone0/temp",
                     "battery": "/sys/class/power_supply/BAT0/capacity"}}
IMAGE = np.zeros((1, 1, 8, 8), np.float32)
log = logging.getLogger("test_closed_loop")


class Device:
    """Scripted inference times: each head count's calibrated latency x the load at time t (x ``extra``
    for some head counts: a slow-down that is not the same for every head count)."""

    def __init__(self, load: Callable[[float], float] = lambda t: 1.0, extra: Optional[Dict[int, float]] = None):
        self.load, self.extra = load, extra or {}

    def ms(self, heads: int, t: float) -> float:
        return CALIBRATED[heads] * self.load(t) * self.extra.get(heads, 1.0)


Trace = List[Tuple[float, int, int]]  # (time, heads running, the table's choice)


def governor(settings: LoopSettings = SETTINGS) -> LatencyGovernor:
    return LatencyGovernor(CALIBRATED, settings, log)


def drive(gov: LatencyGovernor, device: Device, seconds: float, start: float = 0.0,
          ceiling: Callable[[float], int] = lambda t: 12) -> Trace:
    """Inferences at RATE_HZ as the switcher feeds them: run the capped head count, observe, judge."""
    trace = []
    for i in range(round(seconds * RATE_HZ)):
        t = start + i / RATE_HZ
        top = ceiling(t)
        running = gov.limit(top)
        gov.observe(running, device.ms(running, t), t)
        gov.step(gov.limit(top), top, BUDGET, t)
        trace.append((t, running, top))
    return trace


def first(trace: Trace, condition: Callable[[int], bool], after: float = -math.inf) -> float:
    return next(t for t, heads, _ in trace if t >= after and condition(heads))


def most_switches_in_a_minute(trace: Trace) -> int:
    changes = [t for (t, a, _), (_, b, _) in zip(trace, trace[1:]) if a != b]
    return max((sum(1 for u in changes if t <= u < t + 60) for t in changes), default=0)


# -- the governor -----------------------------------------------------------------------------------

def test_a_sustained_slow_down_steps_down_within_the_stated_window_to_a_head_count_that_fits() -> None:
    gov = governor()
    trace = drive(gov, Device(lambda t: 1.5 if t >= 100 else 1.0), 200)
    down = first(trace, lambda heads: heads < 12)
    assert 100 + SETTINGS.sustain_s <= down <= 100 + SETTINGS.window_s + SETTINGS.sustain_s
    # 9 heads would take 45 ms, over 41: the largest that fits is 6 (30 ms), and it stays there
    assert {heads for t, heads, _ in trace if t >= down} == {6}
    assert gov.p90(6, trace[-1][0]) <= BUDGET
    assert re.fullmatch(r"latency p90 60 ms over budget 41 ms for 1\d s at 12 heads: 6 heads, predicted 30 ms "
                        r"\(calibrated 20 ms x 1.50\)", gov.decisions[-1][1])


def test_a_short_burst_or_rare_outliers_change_nothing() -> None:
    burst = SETTINGS.sustain_s - 0.8 * SETTINGS.window_s - 1  # the longest burst the loop is said to sit out, less 1 s

    def load(t: float) -> float:
        outlier = round(t * RATE_HZ) % 20 == 0  # one inference in 20 five times as slow: under the p90
        return 5.0 if outlier else 3.0 if 50 <= t < 50 + burst else 1.0

    trace = drive(governor(), Device(load), 120)
    assert {heads for _, heads, _ in trace} == {12}


def test_when_the_load_goes_the_head_count_returns_after_the_dwell_probed() -> None:
    gov = governor()
    trace = drive(gov, Device(lambda t: 1.5 if 100 <= t < 200 else 1.0), 300)
    assert first(trace, lambda heads: heads < 12) < 200
    up = first(trace, lambda heads: heads == 12, after=150)
    assert 200 + SETTINGS.dwell_s <= up <= 200 + SETTINGS.window_s + SETTINGS.dwell_s + 1 / RATE_HZ
    assert {heads for t, heads, _ in trace if t >= up} == {12}  # the probe was kept
    reasons = [r for _, r in gov.decisions]
    assert re.fullmatch(r"latency back under budget for 30 s \(6 heads p90 20 ms, 12 heads predicted 40 ms\): "
                        r"probing 12 heads for 20 inferences", reasons[-2])
    assert reasons[-1] == "probe of 12 heads: p90 40 ms within budget 41 ms over 20 inferences: keeping 12 heads"


def test_a_probe_that_misses_the_budget_goes_back_and_is_retried_ever_less_often(
        caplog: pytest.LogCaptureFixture) -> None:
    # after the load, 12 heads stay 20 % slower (9 do not): predicted from 6 heads to fit, 12 fail their probes
    device = Device(lambda t: 1.5 if t < 100 else 1.0, extra={12: 1.2})
    with caplog.at_level(logging.INFO, logger=log.name):
        trace = drive(governor(), device, 1200)
    reasons = [r.getMessage() for r in caplog.records]
    assert reasons[1:5] == ["latency back under budget for 30 s (6 heads p90 20 ms, 12 heads predicted 40 ms): "
                            "probing 12 heads for 20 inferences",
                            "probe of 12 heads: p90 48 ms over budget 41 ms; back to 6 heads",
                            "latency back under budget for 30 s (6 heads p90 20 ms, 9 heads predicted 30 ms): "
                            "probing 9 heads for 20 inferences",
                            "probe of 9 heads: p90 30 ms within budget 41 ms over 20 inferences: keeping 9 heads"]
    settled = first(trace, lambda heads: heads == 9)
    assert {heads for t, heads, _ in trace if t >= settled} == {9, 12} and trace[-1][1] == 9  # 12 never kept
    probes = [t for (_, a, _), (t, b, _) in zip(trace, trace[1:]) if (a, b) == (9, 12)]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    dwell = SETTINGS.dwell_s
    assert [round(g / dwell) for g in gaps] == [4, 8, 8, 8]  # failed twice (from 6, then 9): 4x, then at most 8x
    over = sum(1 for t, heads, _ in trace if t >= settled and device.ms(heads, t) > BUDGET)
    assert over == SETTINGS.probe_inferences * len(probes)


def test_at_most_the_set_number_of_switches_a_minute_under_a_flapping_load() -> None:
    quick = LoopSettings(window_s=1, sustain_s=0.5, dwell_s=0.5, min_samples=3)
    trace = drive(governor(quick), Device(lambda t: 2.0 if int(t / 3) % 2 else 1.0), 600)
    assert most_switches_in_a_minute(trace) == quick.max_switches_per_minute  # it wanted more: the limit held


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_never_above_the_table_never_below_the_smallest(seed: int) -> None:
    rng = random.Random(seed)
    ceilings = [rng.choice([3, 6, 9, 12]) for _ in range(200)]  # the table's choice, every 7 s
    loads = [rng.choice([0.8, 1.0, 1.3, 2.0, 4.0]) for _ in range(200)]  # a load, every 11 s

    def load(t: float) -> float:
        return loads[int(t / 11)] * rng.uniform(0.9, 1.1)

    trace = drive(governor(), Device(load), 1200, ceiling=lambda t: ceilings[int(t / 7)])
    assert all(3 <= heads <= top for _, heads, top in trace)
    assert any(heads < top for _, heads, top in trace)  # the loop did take heads away
    assert most_switches_in_a_minute([(t, heads, top) for t, heads, top in trace if heads < top]) <= 2 * 4


def test_garbage_timings_are_ignored_counted_and_logged_once_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    gov = governor()
    bad = [math.nan, "40", None, True, math.inf, -math.inf, -1.0, 1e9]
    with caplog.at_level(logging.WARNING):
        for t in range(20):
            assert [gov.observe(12, ms, float(t)) for ms in bad] == [False] * len(bad)
            assert gov.observe(7, 40.0, float(t)) is False
    assert gov.p90(12, 19.0) is None
    assert gov.ignored == {"not a number": 80, "infinite": 40, "negative": 20, "over 60000 ms": 20,
                           "not a head count of the table": 20}
    assert len(caplog.records) == 5 and all("\n" not in r.getMessage() for r in caplog.records)
    # garbage among good timings moves nothing: 12 heads at 40 ms fit 41 ms
    for i in range(400):
        t = 20 + i / RATE_HZ
        gov.observe(12, 40.0 if i % 2 else math.inf, t)
        gov.step(12, 12, BUDGET, t)
    assert gov.cap == 12 and gov.p90(12, t) == 40.0


@pytest.mark.parametrize("budget", [0, -5.0, math.nan, math.inf, "80"])
def test_a_budget_that_cannot_be_met_is_one_line(budget: object) -> None:
    with pytest.raises(HydraEdgeError, match="latency budget") as e:
        LoopSettings(budget_ms=budget)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
    with pytest.raises(HydraEdgeError, match="latency budget"):
        check_budget(budget, "--budget-ms")


@pytest.mark.parametrize("setting", [{"window_s": 0}, {"dwell_s": math.nan}, {"probe_inferences": 0},
                                     {"max_switches_per_minute": 1}, {"min_samples": 300}, {"expire_s": -1}])
def test_a_bad_loop_setting_is_one_line(setting: dict) -> None:
    name = next(iter(setting))
    with pytest.raises(HydraEdgeError, match=name) as e:
        LoopSettings(**setting)
    assert "\n" not in str(e.value)


# -- the switcher running it ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loop_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manifest-only bundle (3, 6, 9, 12 heads) and its lut.json: bands <60, 60-70, 70-80, >=80 °C pick
    12, 9, 6, 3 heads on mains, as in test_switcher."""
    root = tmp_path_factory.mktemp("loop")
    policy = policy_from_dict({"thermal": {"derating": [1.0, 1.3, 1.9, 3.5]}})
    doc = table(root, CALIBRATED, BUDGET, policy=policy, signals=SIGNALS)
    (root / "bundle" / "lut.json").write_bytes(lut_record.encode(doc, "lut.json"))
    return root / "bundle"


class Wall:
    """The wall clock the correction is dated by."""

    def __init__(self) -> None:
        self.now = 1.75e9

    def __call__(self) -> float:
        return self.now


class Rig:
    """A switcher whose engines take the device's scripted times on a fake clock, as a board app drives it."""

    def __init__(self, bundle: Path, lut: Path, board: Board, monkeypatch: pytest.MonkeyPatch,
                 device: Device) -> None:
        self.bundle, self.lut, self.board, self.device = bundle, lut, board, device
        self.clock, self.wall = Clock(), Wall()
        self.next_poll = self.clock.now

        rig = self

        class Engine:
            def __init__(self, heads: int) -> None:
                self.heads = heads

            def run(self, x: np.ndarray) -> np.ndarray:
                rig.clock.now += rig.device.ms(self.heads, rig.clock.now) / 1e3
                return np.zeros((len(x), 10), np.float32)

        monkeypatch.setattr(switcher_module, "load_record", lambda bundle, record, threads: Engine(record.heads))

    def switcher(self, **loop: float) -> Switcher:
        return Switcher(self.bundle, lut=self.lut, root=str(self.board.root), clock=self.clock, timer=self.clock,
                        wall_clock=self.wall, prefetch=False, latency_loop=LoopSettings(**loop))

    def serve(self, sw: Switcher, seconds: float) -> List[int]:
        """Inferences at RATE_HZ and a poll every second, for ``seconds``; the head count of each."""
        heads, end = [], self.clock.now + seconds
        while self.clock.now < end:
            if self.clock.now >= self.next_poll:
                sw.poll()
                self.next_poll += 1.0
            frame = self.clock.now
            heads.append(sw.predict(IMAGE).heads)
            self.clock.now = max(self.clock.now, frame + 1 / RATE_HZ)
        return heads


@pytest.fixture
def rig(loop_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    """Each test's own copy of lut.json, so the correction it learns lands in its own folder."""
    lut = tmp_path / "lut.json"
    shutil.copy(loop_bundle / "lut.json", lut)
    return Rig(loop_bundle, lut, Board(tmp_path / "board"), monkeypatch, Device())


def loaded(rig: Rig, factor: float) -> None:
    rig.device.load = lambda t: factor


def test_the_switcher_steps_down_under_load_says_why_saves_it_and_comes_back(rig: Rig) -> None:
    with rig.switcher() as sw:
        assert set(rig.serve(sw, 30)) == {12}
        loaded(rig, 1.5)
        heads = rig.serve(sw, SETTINGS.window_s + SETTINGS.sustain_s)
        assert heads[-1] == 6
        event = sw.events[-1]
        assert (event.from_heads, event.to_heads) == (12, 6) and event.reading is not None
        assert sw.reasons(1)[0].startswith("latency p90 60 ms over budget 41 ms for 10 s at 12 heads: 6 heads")
        sw.wait_prefetch()  # the correction is written off the inference thread
        saved = json.loads(correction_path(rig.lut).read_text())
        [learned] = saved["learned"]  # the window's timings of 12 heads: 5 s at 10 a second
        assert learned == {"heads": 12, "p90_ms": pytest.approx(60.0), "slowdown": pytest.approx(1.5),
                           "samples": pytest.approx(SETTINGS.window_s * RATE_HZ, abs=1)}
        assert saved["saved_at"] == rig.wall.now and sw.latency_status()["cap"] == 6
        loaded(rig, 1.0)
        heads = rig.serve(sw, SETTINGS.window_s + SETTINGS.dwell_s + 5)
        assert heads[-1] == 12 and sw.reasons(1)[0].startswith("latency back under budget for 30 s")
        assert [e.to_heads for e in sw.events] == [12, 6, 12]


def test_the_budget_is_the_battery_bands(rig: Rig) -> None:
    rig.board.battery(15)  # discharging, under 20 %: budget 41 x 0.5 = 20.5 ms, so the table picks 6 heads
    with rig.switcher() as sw:
        assert set(rig.serve(sw, 20)) == {6}
        loaded(rig, 1.2)  # 6 heads take 24 ms: over 20.5; 3 heads 12 ms fit
        assert rig.serve(sw, 20)[-1] == 3
        assert sw.latency_status()["budget_ms"] == 20.5


def test_a_budget_given_to_the_loop_replaces_the_tables(rig: Rig) -> None:
    with rig.switcher(budget_ms=25.0) as sw:  # no load: 12 heads take 40 ms, over 25; 6 take 20
        assert rig.serve(sw, 30)[-1] == 6


def test_the_fail_safe_rules_still_win(rig: Rig, tmp_path: Path) -> None:
    with rig.switcher() as sw:
        loaded(rig, 1.5)
        assert rig.serve(sw, 30)[-1] == 6  # the loop's cap
        rig.board.temp(85)  # the table: 3 heads, at once
        assert set(rig.serve(sw, 3)[10:]) == {3}
        rig.board.temp(40)  # cool again: the table allows 12 after raise_after_s; the cap still holds 6
        assert set(rig.serve(sw, 15)[-20:]) == {6}
        assert "held at 6 heads by the latency loop" in sw.reasons(1)[0]
        shutil.rmtree(rig.board.root / "sys/class/thermal")  # the sensor fails: held, then the hottest band
        assert rig.serve(sw, sw.settings.stale_after_s + 3)[-1] == 3
        loaded(rig, 1.0)  # the load goes while the sensor is failed: the loop never raises above the table
        assert set(rig.serve(sw, 120)) == {3}


def test_the_loop_probes_no_higher_than_the_tables_choice(rig: Rig) -> None:
    rig.board.temp(65)  # the table: 9 heads
    with rig.switcher() as sw:
        loaded(rig, 1.5)  # 9 heads take 45 ms: over budget; 6 heads 30 ms
        assert rig.serve(sw, 30)[-1] == 6
        loaded(rig, 1.0)
        heads = rig.serve(sw, 120)
        assert max(heads) == 9 and heads[-1] == 9


@pytest.mark.parametrize("lower, allowed", [("heat", 3), ("battery", 6)])
def test_the_table_lowering_its_choice_during_a_probe_is_obeyed_at_once(rig: Rig, lower: str, allowed: int) -> None:
    """The loop only lowers: when heat or a falling battery lowers the table's choice while the loop probes
    more heads, the next inference runs no more than the table's new choice (the probe does not finish first)."""
    with rig.switcher() as sw:
        loaded(rig, 1.5)
        assert rig.serve(sw, 30)[-1] == 6
        loaded(rig, 1.0)
        for _ in range(round(120 * RATE_HZ)):  # inference by inference, until the loop probes 12 heads
            if sw.latency_status()["probing"] == 12:
                break
            rig.serve(sw, 1 / RATE_HZ)
        assert sw.latency_status()["probing"] == 12 and sw.heads == 12
        {"heat": lambda: rig.board.temp(85), "battery": lambda: rig.board.battery(15)}[lower]()
        sw.poll()  # the board's next poll reads it
        assert max(rig.serve(sw, 60)) == allowed


def learned_correction(rig: Rig) -> dict:
    """Run under load until the loop has stepped down and saved; the saved document."""
    loaded(rig, 1.5)
    with rig.switcher() as sw:
        assert rig.serve(sw, 30)[-1] == 6
        sw.wait_prefetch()
    return json.loads(correction_path(rig.lut).read_text())


def test_after_a_restart_the_saved_correction_is_used_until_it_expires(rig: Rig) -> None:
    learned_correction(rig)
    rig.wall.now += 600
    with rig.switcher() as sw:  # still loaded: starts at 6, not 12 for a sustained window first
        assert set(rig.serve(sw, 20)) == {6}
        assert re.fullmatch(r"start; latency correction saved 600 s ago: 9 heads predicted 45 ms, over budget "
                            r"41 ms: at most 6 heads", sw.events[0].reason)
    rig.wall.now += SETTINGS.expire_s
    with rig.switcher() as sw:
        assert sw.poll() == 12 and sw.events[0].reason == "start"


@pytest.mark.parametrize("spoil", ["damaged", "truncated", "another table", "another bundle", "from the future",
                                   "heads the table lacks", "a folder"])
def test_a_correction_that_cannot_be_trusted_is_one_warning_and_the_tables_choice(
        rig: Rig, spoil: str, caplog: pytest.LogCaptureFixture) -> None:
    doc = learned_correction(rig)
    path = correction_path(rig.lut)
    text = path.read_text()
    changes = {"another table": {"lut_sha256": "0" * 64}, "another bundle": {"manifest_sha256": "f" * 64},
               "from the future": {"saved_at": rig.wall.now + 60},
               "heads the table lacks": {"learned": [{**doc["learned"][0], "heads": 7}]}}
    if spoil == "damaged":
        path.write_text("{not json")
    elif spoil == "truncated":
        path.write_text(text[:len(text) // 2])
    elif spoil == "a folder":
        path.unlink()
        path.mkdir()
    else:
        path.write_text(json.dumps({**doc, **changes[spoil]}))
    loaded(rig, 1.0)
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), rig.switcher() as sw:
        assert set(rig.serve(sw, 5)) == {12}  # the table's choice, never more
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    assert str(path) in caplog.records[0].getMessage()


@pytest.mark.parametrize("spoil", ["another table", "another bundle", "both"])
def test_a_correction_from_elsewhere_names_the_sha256_that_differs(
        rig: Rig, spoil: str, caplog: pytest.LogCaptureFixture) -> None:
    doc = learned_correction(rig)
    changes = {"another table": {"lut_sha256": "0" * 64}, "another bundle": {"manifest_sha256": "f" * 64},
               "both": {"lut_sha256": "0" * 64, "manifest_sha256": "f" * 64}}[spoil]
    correction_path(rig.lut).write_text(json.dumps({**doc, **changes}))
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), rig.switcher():
        pass
    (message,) = [r.getMessage() for r in caplog.records]
    named = {"lut.json": f"lut.json sha256 {'0' * 12}, this table's {doc['lut_sha256'][:12]}",
             "manifest": f"manifest.json sha256 {'f' * 12}, this bundle's {doc['manifest_sha256'][:12]}"}
    expected = {"another table": ["lut.json"], "another bundle": ["manifest"], "both": ["manifest", "lut.json"]}[spoil]
    assert all(named[k] in message for k in expected) and not any(named[k] in message for k in named if k not in expected)
    assert message.count("sha256") == len(expected), message


@pytest.mark.parametrize("wall", [-1.0, -86400.0 * 365, math.nan, math.inf])
def test_a_wall_clock_before_1970_or_no_number_is_a_failed_read_once_not_a_crash(
        rig: Rig, wall: float, caplog: pytest.LogCaptureFixture) -> None:
    """A phone or board whose clock was never set (or reset to before 1970) can date nothing: the saved
    correction is not restored (its age is unknown) and nothing is written, one warning in all."""
    learned_correction(rig)
    path = correction_path(rig.lut)
    saved = path.read_bytes()
    rig.wall.now = wall
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), rig.switcher() as sw:
        assert sw.poll() == 12 and sw.events[0].reason == "start"  # not restored: it said 6 heads
        loaded(rig, 1.5)
        assert rig.serve(sw, 30)[-1] == 6  # the loop still learns and steps down
        sw.wait_prefetch()
    assert path.read_bytes() == saved
    (message,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in message and "wall clock" in message and "1970" in message, message


def test_a_correction_that_cannot_be_written_is_one_warning_and_the_loop_goes_on(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    correction_path(rig.lut).mkdir()  # nothing can be renamed over a folder
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), rig.switcher() as sw:
        caplog.clear()  # the folder found at start is its own warning (tested above)
        loaded(rig, 1.5)
        assert rig.serve(sw, 30)[-1] == 6
        loaded(rig, 1.0)
        assert rig.serve(sw, 60)[-1] == 12
        sw.wait_prefetch()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"cannot save the latency correction to {correction_path(rig.lut)}"]


def test_the_loop_needs_only_the_standard_library_and_msgspec() -> None:
    """What boards import for it: no numpy, no torch (the switcher brings numpy for the engines)."""
    code = ("import sys; before = set(sys.modules); import hydra_edge.runtime.closed_loop;"
            "used = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names);"
            "used.discard('typing_extensions');"  # msgspec imports it where it is installed
            "assert used == {'hydra_edge', 'msgspec'}, used")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
