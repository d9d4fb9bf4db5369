"""The calibration plan (hydra_edge.calibration_plan) on a simulated device: the p90's interval from the
order statistics, the stop rule, interleaved rounds against today's one-after-another timing, and the
thermal gate. A fake clock and engine (support.simdevice): nothing here is timed for real."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Callable

import pytest
from support.simdevice import Z90, SimDevice

from hydra_edge.calibration_plan import (LEVEL, LOOK_LEVEL, MAX_TIMED_RUNS, Gate, GateRule, StopRule, Tally, drift, recorded_start,
                                         interleave, order_ranks, timed_block)
from hydra_edge.records.calibration import Round
from hydra_edge.runtime.latency import percentile

TEN = {h: 10.0 * (1 + 0.1 * (h - 3)) for h in range(3, 13)}  # ms: ten head counts, 10 % apart


def _binomial_cdf(n: int, q: Fraction, k: int) -> Fraction:
    return sum((math.comb(n, i) * q**i * (1 - q)**(n - i) for i in range(k + 1)), Fraction(0))


@pytest.mark.parametrize("n", [40, 41, 57, 100, 233])
@pytest.mark.parametrize("level", [LEVEL, LOOK_LEVEL])
def test_order_ranks_are_the_tightest_binomial_ranks_that_hold_the_p90(n: int, level: float) -> None:
    """Exact rationals: x(lo+1) <= p90 < x(hi+1) has probability >= level, and neither end can move in."""
    lo, hi = order_ranks(n, level=level)
    q, tail = Fraction(9, 10), (1 - Fraction(level)) / 2
    assert _binomial_cdf(n, q, lo) <= tail < _binomial_cdf(n, q, lo + 1)  # lo + 1 would leave too much below
    assert _binomial_cdf(n, q, hi) >= 1 - tail > _binomial_cdf(n, q, hi - 1)
    assert _binomial_cdf(n, q, hi) - _binomial_cdf(n, q, lo) >= Fraction(level)


def test_too_few_timings_have_no_interval() -> None:
    """0.9^n must fall under the upper tail for the p90's upper end: n >= 36 at 95 %, 40 at 97 %."""
    assert order_ranks(35, level=0.95) is None and order_ranks(36, level=0.95) is not None
    assert order_ranks(39) is None and order_ranks(40) is not None


def _calibrate_one(draw: Callable[[random.Random], float], seed: int, rule: StopRule = StopRule()) -> Tally:
    rng, now = random.Random(seed), [0.0]

    def step() -> None:
        now[0] += draw(rng)

    tally = Tally(0)
    interleave({0: tally}, lambda heads: timed_block(step, lambda: now[0], 0, 0.25), rule, lambda: now[0],
               random.Random(seed))
    return tally


CALIBRATIONS = 800  # per distribution; ~1 s each here


@pytest.mark.parametrize("draw, true_p90", [
    (lambda r: 0.005 * math.exp(r.gauss(0, 0.2)), 0.005 * math.exp(Z90 * 0.2)),  # lognormal
    # a runtime that stalls 20 % of the time: 5 ms +- 1 %, else 8 ms +- 1 %; the p90 lies in the slow mode
    (lambda r: (0.008 if r.random() < 0.2 else 0.005) * (1 + 0.01 * (2 * r.random() - 1)), 0.008),
], ids=["lognormal", "stalls"])
def test_the_stop_rules_interval_holds_the_true_p90_at_least_95_percent_of_the_time(draw, true_p90) -> None:
    """The rule looks after every block and stops once tight, which a 95 % interval per look survives only
    ~94.7 % of the time; built at LOOK_LEVEL, over CALIBRATIONS simulated calibrations it holds >= 95 %."""
    covered = 0
    for seed in range(CALIBRATIONS):
        tally = _calibrate_one(draw, seed)
        low, high = tally.interval_s()
        assert tally.stopped == "interval" and high - low <= 2 * 0.05 * percentile(tally.sorted_s, 90)
        covered += low <= true_p90 <= high
    assert covered / CALIBRATIONS >= LEVEL, covered


def test_the_floors_hold_before_the_interval_counts() -> None:
    """A steady engine is tight at once, yet is timed for 50 runs and 1 s of runs."""
    tally = _calibrate_one(lambda r: 0.001 * (1 + 1e-4 * r.random()), 0)
    assert tally.stopped == "interval" and len(tally.sorted_s) >= 50 and tally.timed_s >= 1.0
    assert tally.timed_s < 1.0 + 0.25 + 0.002  # stopped at the first block past the floor
    few = _calibrate_one(lambda r: 0.05 * (1 + 1e-4 * r.random()), 0, StopRule(min_s=0.0))
    assert few.stopped == "interval" and 50 <= len(few.sorted_s) < 55  # blocks of 5 at 0.05 s: 50 runs in ten


def test_a_head_count_that_never_settles_stops_at_its_cap_and_says_so() -> None:
    rule = StopRule(cap_s=3.0)
    tally = _calibrate_one(lambda r: 0.001 * math.exp(r.gauss(0, 1.5)), 0, rule)
    assert tally.stopped == "cap" and not tally.tight(rule.within)
    assert rule.cap_s <= tally.spent_s < rule.cap_s + tally.blocks[-1]["spent_s"] + 1e-9
    latency = tally.latency()
    assert latency["p90_low_ms"] < latency["p90_ms"] < latency["p90_high_ms"]
    assert latency["count"] == len(tally.sorted_s)


def test_a_cap_too_small_for_any_interval_keeps_what_it_timed_without_one() -> None:
    tally = _calibrate_one(lambda r: 0.01 * math.exp(r.gauss(0, 0.1)), 0, StopRule(cap_s=0.1))
    latency = tally.latency()
    assert tally.stopped == "cap" and 0 < latency["count"] < 40
    assert latency["p90_low_ms"] is None and latency["p90_high_ms"] is None and latency["p90_ms"] > 0


def _sequential_today(device: SimDevice) -> dict[int, float]:
    """Today's calibration: each head count in turn, 10 warm-up and 50 timed runs, its p90 (ms)."""
    p90 = {}
    for heads in sorted(device.base_ms):
        for _ in range(10):
            device.step(heads)
        runs = []
        for _ in range(50):
            start = device.clock()
            device.step(heads)
            runs.append((device.clock() - start) * 1e3)
        p90[heads] = percentile(sorted(runs), 90)
    return p90


def _interleaved(device: SimDevice, gated: bool = True, rule: StopRule = StopRule(),
                 on_round: Callable = lambda event: None, block_s: float = 0.25) -> dict[int, Tally]:
    tallies = {heads: Tally(heads) for heads in device.base_ms}
    gate = Gate(GateRule(), device.state, device.clock, device.sleep) if gated else None
    interleave(tallies, lambda h: timed_block(lambda: device.step(h), device.clock, 2, block_s), rule, device.clock,
               random.Random(device.seed), gate, on_round=on_round)
    return tallies


@pytest.mark.parametrize("seed", range(3))
def test_sequential_timing_sizes_head_counts_by_when_they_ran_and_interleaved_does_not(seed: int) -> None:
    """A device that warms as it works: timed one after another, 12 heads carries the heat of the nine
    before it and is overstated against 3 heads by ~10 %. Interleaved and gated (p90s known to 2 % here,
    so the comparison is not lost in their own noise), every head count's p90 is within 7 % of its cool
    p90 (one round's heat, 2.5 s, on top of the gate's 2 °C margin: at most ~6.5 % slower), and all of
    them alike: within 4 % of one another, where the sequential ones spread over 7 %."""
    device = SimDevice(TEN, seed=seed)
    sequential = {h: p90 / device.true_p90_ms(h) for h, p90 in _sequential_today(device).items()}
    assert sequential[12] / sequential[3] > 1.07
    device = SimDevice(TEN, seed=seed)
    tallies = _interleaved(device, rule=StopRule(within=0.02))
    ratios = {h: percentile(t.sorted_s, 90) * 1e3 / device.true_p90_ms(h) for h, t in tallies.items()}
    assert all(0.97 < r < 1.07 for r in ratios.values()), ratios
    assert max(ratios.values()) / min(ratios.values()) < 1.04
    assert all(t.stopped == "interval" for t in tallies.values())


@pytest.mark.parametrize("seed", range(3))
def test_a_background_task_misorders_sequential_head_counts_but_not_interleaved_ones(seed: int) -> None:
    """A task slows the device 30 % for 2 s (no heat): one after another, the head counts timed then look
    slower than larger ones; interleaved in rounds shorter than the task (blocks of 5 runs), it falls on
    all alike and the p90s keep the heads' order."""
    spread = {h: 10.0 * (1 + 0.08 * (h - 3)) for h in range(3, 13)}
    device = SimDevice(spread, seed=seed, slow_per_c=0.0, hog=(2.0, 4.0, 1.3))
    sequential = _sequential_today(device)
    assert sorted(sequential, key=sequential.get) != sorted(spread)
    device = SimDevice(spread, seed=seed, slow_per_c=0.0, hog=(2.0, 4.0, 1.3))
    tallies = _interleaved(device, gated=False, block_s=0.0)
    p90 = {h: percentile(t.sorted_s, 90) for h, t in tallies.items()}
    assert sorted(p90, key=p90.get) == sorted(spread)


def test_rounds_visit_every_open_head_count_in_a_new_order() -> None:
    rounds: list[dict] = []
    tallies = _interleaved(SimDevice(TEN), on_round=rounds.append)
    assert len(rounds) >= 3 and rounds[0]["round"] == 1
    for event in rounds:
        assert sorted(event["order"]) == [h for h, t in tallies.items() if event["round"] <= t.blocks[-1]["round"]]
    everyone = [tuple(event["order"]) for event in rounds if len(event["order"]) == len(TEN)]
    assert len(everyone) >= 3 and len(set(everyone)) == len(everyone)
    for tally in tallies.values():  # one block per round it was open in
        assert [b["round"] for b in tally.blocks] == list(range(1, len(tally.blocks) + 1))


def test_the_gate_waits_for_the_start_temperature_then_times() -> None:
    """Each round after the first finds the device warmer than it began; it waits (idle, cooling) until
    within the margin, records the wait, and only then times."""
    device = SimDevice(TEN)
    rule, rounds, temps = GateRule(margin_c=2.0, max_wait_s=600.0), [], []
    gate = Gate(rule, device.state, device.clock, device.sleep)
    tallies = {heads: Tally(heads) for heads in TEN}

    def block(heads: int) -> list[float]:
        temps.append(device.temp_c)
        return timed_block(lambda: device.step(heads), device.clock, 2, 0.25)

    interleave(tallies, block, StopRule(), device.clock, random.Random(0), gate, on_round=rounds.append)
    waits = [r["gate"] for r in rounds]
    assert waits[0] == {"waited_s": 0.0, "outcome": "ready", "state": {"max_temp_c": 30.0},
                        "start": {"max_temp_c": 30.0}}
    assert all(w["outcome"] == "ready" for w in waits) and all(w["waited_s"] > 0 for w in waits[1:])
    assert all(w["state"]["max_temp_c"] <= 30.0 + rule.margin_c for w in waits)
    # the first block of each round starts at the temperature the gate let through
    firsts = [sum(len(r["order"]) for r in rounds[:i]) for i in range(len(rounds))]
    assert [temps[i] for i in firsts] == [w["state"]["max_temp_c"] for w in waits]


def test_the_gate_waits_at_most_its_bound() -> None:
    device = SimDevice(TEN, tau_cool_s=1e6)  # never cools
    gate = Gate(GateRule(max_wait_s=30.0, poll_s=4.0), device.state, device.clock, device.sleep)
    for _ in range(2000):
        device.step(12)
    wait = gate.wait()
    assert wait["outcome"] == "timeout" and wait["waited_s"] == pytest.approx(30.0)
    assert "°C, over 30.0 + 2" in wait["why"]


def test_a_device_without_a_temperature_waits_nothing_and_says_so() -> None:
    gate = Gate(GateRule(), lambda: {"max_temp_c": None, "android_thermal_status": None}, lambda: 0.0,
                lambda s: pytest.fail("slept"))
    assert not gate.gated and gate.wait() == {"waited_s": 0.0, "outcome": "ungated",
                                              "why": "the device reports no temperature", "start": {}}


def test_a_reading_that_fails_mid_calibration_is_not_waited_on() -> None:
    device = SimDevice(TEN, reads_fail_after_s=5.0)
    rounds: list[dict] = []
    tallies = _interleaved(device, on_round=rounds.append)
    outcomes = [r["gate"]["outcome"] for r in rounds]
    assert outcomes[0] == "ready" and "reading failed" in outcomes
    failed = next(r["gate"] for r in rounds if r["gate"]["outcome"] == "reading failed")
    assert failed["waited_s"] < GateRule().max_wait_s and failed["why"] == "the device no longer reports max_temp_c"
    assert all(t.stopped == "interval" for t in tallies.values())


@pytest.mark.parametrize("status, headroom, why", [(2, 0.4, "thermal status 2, over 1"),
                                                     (1, 0.9, "headroom 0.90, over 0.70")])
def test_the_gate_reads_androids_status_and_headroom(status: int, headroom: float, why: str) -> None:
    states = iter([{"android_thermal_status": 1, "android_thermal_headroom": 0.5},
                   {"android_thermal_status": status, "android_thermal_headroom": headroom},
                   {"android_thermal_status": 1, "android_thermal_headroom": 0.6}])
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    gate = Gate(GateRule(poll_s=3.0), lambda: next(states), lambda: now[0], sleep)
    assert gate.wait()["outcome"] == "ready" and slept == [3.0]
    states = iter([{"android_thermal_status": status, "android_thermal_headroom": headroom}] * 100)
    assert gate.wait()["why"] == why


def test_drift_is_flagged_when_a_head_counts_rounds_disagree() -> None:
    """A device that slows 20 % for good half-way (ungated, no heat): each head count's earlier and later
    rounds' p90 intervals do not overlap; on a steady device they do. Every head count is timed to its
    30 s cap (an interval never tight enough), so all run the same rounds and 150 s is half-way."""
    rule = StopRule(within=0.0, min_runs=0, min_s=0.0, cap_s=30.0)
    steady = _interleaved(SimDevice(TEN, slow_per_c=0.0), gated=False, rule=rule)
    assert not any(drift(t.blocks) for t in steady.values())
    stepped = _interleaved(SimDevice(TEN, slow_per_c=0.0, hog=(150.0, 1e9, 1.2)), gated=False, rule=rule)
    flagged = {h: drift(t.blocks) for h, t in stepped.items()}
    assert all(flagged.values()), flagged
    early, late = flagged[12]
    assert early[2] < late[1] and late[0] / early[0] == pytest.approx(1.2, rel=0.05)
    assert all(drift(t.blocks, 0.1) for t in stepped.values())  # 20 % is past the 10 % asked to resolve
    assert not any(drift(t.blocks, 0.3) for t in stepped.values())  # within 30 %: no drift worth a word


def test_halves_apart_by_less_than_within_are_no_drift_however_tight() -> None:
    """Thousands of runs a half, 2 % apart: the intervals are far narrower than that and do not overlap, but a
    calibration asked for 5 % is not told its device drifted; one asked for 1 % is."""
    rng = random.Random(7)
    blocks = [{"latencies_ms": [base * rng.uniform(1.0, 1.01) for _ in range(2000)]} for base in (1.0, 1.02)]
    assert drift(blocks, 0.05) is None and drift(blocks, 0.01) is not None and drift(blocks) is not None


# --- each comparison of the rule at its exact boundary -------------------------------------------------


def test_an_interval_exactly_within_is_tight() -> None:
    """n = 40: ranks (30, 39); p90 at position 35.1 = 100 exactly; ends 95 and 105: exactly +-5 %."""
    assert order_ranks(40) == (30, 39)
    values = [90.0] * 30 + [95.0] * 5 + [100.0] * 4 + [105.0]
    tally = Tally(3, sorted_s=sorted(values))
    assert tally.interval_s() == (95.0, 105.0)
    assert tally.tight(0.05)
    assert not tally.tight(0.0499)


def test_the_time_floor_counts_timed_runs_not_warm_ups() -> None:
    """Blocks of 100 untimed and 100 timed 1 ms runs: the cap's clock (spent) runs twice as fast as the
    floor's (timed); the 1 s floor is of timed runs."""
    now = [0.0]

    def step() -> None:
        now[0] += 0.001

    tally = Tally(3)
    interleave({3: tally}, lambda h: timed_block(step, lambda: now[0], 100, 0.1), StopRule(), lambda: now[0],
               random.Random(0))
    assert tally.stopped == "interval" and tally.timed_s >= 1.0 and tally.spent_s >= 2.0


def test_a_cap_spent_exactly_stops() -> None:
    now = [0.0]

    def step() -> None:
        now[0] += 0.0625  # exact in binary

    tally = Tally(3)
    interleave({3: tally}, lambda h: timed_block(step, lambda: now[0], 0, 0.0), StopRule(min_runs=10**6, cap_s=0.625),
               lambda: now[0], random.Random(0))
    assert tally.stopped == "cap" and tally.spent_s == 0.625 and len(tally.blocks) == 2


def _gate(start: dict, then: dict, rule: GateRule) -> dict:
    states = iter([start, then])
    now = [0.0]
    return Gate(rule, lambda: next(states), lambda: now[0], lambda s: now.__setitem__(0, now[0] + s)).wait()


def test_a_device_exactly_at_the_margin_is_ready() -> None:
    assert _gate({"max_temp_c": 30.0}, {"max_temp_c": 32.0}, GateRule(margin_c=2.0))["outcome"] == "ready"


def test_a_headroom_exactly_at_the_bound_is_ready() -> None:
    out = _gate({"android_thermal_headroom": 0.5}, {"android_thermal_headroom": 0.7}, GateRule(headroom=0.7))
    assert out["outcome"] == "ready"


def test_the_time_floor_met_exactly_stops() -> None:
    now = [0.0]

    def step() -> None:
        now[0] += 0.015625  # exact in binary: 64 runs (two blocks of 32) are exactly 1 s

    tally = Tally(3)
    interleave({3: tally}, lambda h: timed_block(step, lambda: now[0], 0, 0.5), StopRule(min_runs=10), lambda: now[0],
               random.Random(0))
    assert tally.stopped == "interval" and tally.timed_s == 1.0 and len(tally.blocks) == 2


def test_drift_is_flagged_when_the_device_speeds_up_half_way() -> None:
    """A background task slows the device 20 % for the first 150 s, then goes: the later rounds are faster."""
    base = {3: 10.0, 6: 13.0}
    device = SimDevice(base, slow_per_c=0.0, hog=(0.0, 150.0, 1.2))
    tallies = {h: Tally(h) for h in base}
    rule = StopRule(within=0.0, min_runs=0, min_s=0.0, cap_s=150.0)
    interleave(tallies, lambda h: timed_block(lambda: device.step(h), device.clock, 2, 0.25), rule, device.clock,
               random.Random(0))
    flagged = {h: drift(t.blocks) for h, t in tallies.items()}
    assert all(flagged.values()), flagged
    early, late = flagged[3]
    assert late[2] < early[1]


def test_a_head_count_whose_interval_never_tightens_stops_at_the_most_runs_kept() -> None:
    """Timings spread over two modes, asked for ±0.1 %: the interval never gets there, the cap is far, and it
    stops after the most runs a record keeps, within one block of them."""
    rng, tally, rule = random.Random(5), Tally(3), StopRule(within=0.001, min_s=0.0, cap_s=1e9)
    while tally.judge(rule) is None:
        tally.add(len(tally.blocks) + 1, [rng.choice([0.001, 0.002]) * rng.uniform(1, 1.5) for _ in range(997)], 1.0)
    assert tally.stopped == "runs" and MAX_TIMED_RUNS <= len(tally.sorted_s) < MAX_TIMED_RUNS + 997


def test_a_resumed_calibration_gates_on_the_start_its_first_run_recorded() -> None:
    """Interrupted while hot and resumed: its rounds wait for the state the calibration began in, read back
    from the record, not for the hot state it resumed in (which would let every later round run hot)."""
    device = SimDevice({3: 5.0}, seed=0)
    first = Gate(GateRule(max_wait_s=600.0), device.state, device.clock, device.sleep)
    record = [Round(round=1, order=[3], started_s=0.0, gate=first.wait())]
    assert record[0].gate["start"] == {"max_temp_c": 30.0}
    for _ in range(20_000):  # timed until hot, then stopped
        device.step(3)
    hot = device.temp_c
    assert hot > 40.0
    assert recorded_start([Round(round=2, order=[3], started_s=1.0), *record]) == {"max_temp_c": 30.0}
    resumed = Gate(GateRule(max_wait_s=600.0), device.state, device.clock, device.sleep, recorded_start(record))
    waited = resumed.wait()
    assert waited["outcome"] == "ready" and waited["waited_s"] > 10.0 and device.temp_c <= 32.0
    # read afresh, the resumed run would have taken the hot state as its start and not waited at all
    for _ in range(20_000):
        device.step(3)
    assert Gate(GateRule(), device.state, device.clock, device.sleep).wait()["waited_s"] == 0.0
    assert recorded_start([]) is None
    assert recorded_start([Round(round=1, order=[3], started_s=0.0, gate={"outcome": "ready"})]) is None
    # a recorded start that is not numbers (a hand-edited or hostile record) gates on nothing it cannot compare
    assert Gate(GateRule(), device.state, device.clock, device.sleep, {"max_temp_c": True}).gated is False
