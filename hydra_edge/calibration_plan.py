"""How a calibration times head counts: until each p90 is known, in interleaved rounds, each round gated
on the device's thermal state. One plan for the device runner, the host and the tests.

Why each rule:

- **Stop on evidence.** A fixed number of runs says nothing about how well the p90 is known. Each head
  count is timed until the 95 % interval of its p90 lies within ``within`` (5 %) of it, never under
  ``min_runs`` and ``min_s`` (LiteRT's ``benchmark_model`` floor: 50 runs, 1 s) and never past ``cap_s``
  of its own time. The interval is distribution-free: with n independent timings the number below the
  true p90 is Binomial(n, 0.9), so order statistics at the binomial's 2.5 % and 97.5 % points hold it
  with at least 95 % probability whatever the shape of the latency distribution (``order_ranks``).
- **Interleave.** A device drifts while it is timed (it warms, a governor steps, a background task
  wakes). Timed one after another, the last head counts carry the drift. Rounds visit every open head
  count in a new random order, a block of runs each, so drift falls on all alike.
- **Gate on the thermal state.** Each round starts only once the device is back in the state the
  calibration started in (``Gate``), waiting at most ``max_wait_s``; every wait is recorded.

Standard library and ``hydra_edge.runtime.latency`` only: ``calibration/runner.py`` runs this on a
board, and the tests drive it with a simulated device (a fake clock and engine).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .runtime.latency import percentile, summarize_latencies

Q = 0.9  # the quantile the table plans with: the device's latency loop judges a windowed p90
LEVEL = 0.95  # what the record claims: the p90's interval holds the true p90 at least this often
# The stop rule looks at the interval after every block and stops when it is tight: a 95 % interval at each
# look then holds the true p90 only ~94.7 % of the time at the stop (simulated). Built at 97 % per look it
# holds it at least 95 % of the time (tests/test_calibration_plan.py), for ~15 % more runs.
LOOK_LEVEL = 0.97
MIN_BLOCK_RUNS = 5  # a block shorter than this is mostly its warm-up
# The most timed runs a head count keeps: every run is in the record (its blocks), and a model of a few
# µs a run on a device too noisy to tighten its interval would otherwise fill its cap with millions of them
# (ten head counts at this many are ~2.5 MB of record). 30,000 runs put the p90's ranks within ~0.4 % of
# the quantile: a wider interval after them is the device's spread, which more runs do not narrow.
MAX_TIMED_RUNS = 30_000


@lru_cache(maxsize=8192)
def order_ranks(n: int, q: float = Q, level: float = LOOK_LEVEL) -> Optional[Tuple[int, int]]:
    """0-based indices ``(lo, hi)`` into ``n`` sorted timings whose values hold the true ``q``-quantile
    with probability at least ``level``; None when ``n`` is too small for either end (the p90's upper
    end needs 36 timings at 95 %, 40 at 97 %).

    With B, the number of timings below the quantile, ~ Binomial(n, q): x(j) <= quantile < x(k) (1-based)
    exactly when j <= B <= k - 1, so j is the largest with P(B <= j - 1) <= alpha / 2 and k the smallest
    with P(B <= k - 1) >= 1 - alpha / 2. The binomial is summed in log space (q^n underflows).
    """
    alpha = 1.0 - level
    log_pmf, odds = n * math.log1p(-q), math.log(q / (1.0 - q))
    cdf, below = 0.0, 0  # below: how many k have P(B <= k) <= alpha / 2
    for k in range(n):
        cdf += math.exp(log_pmf)
        if cdf <= alpha / 2:
            below += 1
        elif cdf >= 1.0 - alpha / 2:
            return (below - 1, k) if below else None
        log_pmf += math.log((n - k) / (k + 1)) + odds
    return None


@dataclass(frozen=True)
class StopRule:
    """When a head count's timing stops: its p90 known to ``within``, or its ``cap_s`` spent, or its
    ``max_runs`` timed."""

    within: float = 0.05  # the 95 % interval's ends within this share of the p90
    min_runs: int = 50
    min_s: float = 1.0  # of timed runs
    cap_s: float = 60.0  # of its own blocks (warm-ups included), checked between blocks
    max_runs: int = MAX_TIMED_RUNS


@dataclass
class Tally:
    """One head count's timings so far (seconds, kept sorted), its blocks and, once stopped, why."""

    heads: int
    sorted_s: List[float] = field(default_factory=list)
    timed_s: float = 0.0  # the runs' own time
    spent_s: float = 0.0  # its blocks' wall time, warm-ups included: what the cap counts
    blocks: List[Dict[str, Any]] = field(default_factory=list)  # {"round", "latencies_ms", "spent_s"}
    stopped: Optional[str] = None  # "interval" | "cap" | "runs"; "error" where its timer gave up on it

    def add(self, round_no: int, latencies_s: Sequence[float], spent_s: float) -> None:
        for value in latencies_s:
            bisect.insort(self.sorted_s, value)
        self.timed_s += sum(latencies_s)
        self.spent_s += spent_s
        self.blocks.append({"round": round_no, "latencies_ms": [round(v * 1e3, 5) for v in latencies_s],
                            "spent_s": spent_s})

    def interval_s(self) -> Optional[Tuple[float, float]]:
        ranks = order_ranks(len(self.sorted_s))
        return None if ranks is None else (self.sorted_s[ranks[0]], self.sorted_s[ranks[1]])

    def tight(self, within: float) -> bool:
        """Whether the p90's interval lies within ``within`` of the p90, both ends."""
        interval = self.interval_s()
        if interval is None:
            return False
        p90 = percentile(self.sorted_s, 90)
        return p90 - interval[0] <= within * p90 and interval[1] - p90 <= within * p90

    def judge(self, rule: StopRule) -> Optional[str]:
        """Stop once the interval is tight (after the floors), or once the cap is spent, or the most runs
        kept are timed; say which. Never before a first block: even a cap of 0 times one."""
        if self.stopped or not self.blocks:
            return self.stopped
        if len(self.sorted_s) >= rule.min_runs and self.timed_s >= rule.min_s and self.tight(rule.within):
            self.stopped = "interval"
        elif self.spent_s >= rule.cap_s:
            self.stopped = "cap"
        elif len(self.sorted_s) >= rule.max_runs:
            self.stopped = "runs"
        return self.stopped

    def latency(self) -> Dict[str, Any]:
        """The record's latency: ``LatencyStats`` in ms with the p90's interval (null ends: too few runs)."""
        stats = asdict(summarize_latencies(self.sorted_s))
        interval = self.interval_s()
        stats.update(p90_low_ms=None if interval is None else interval[0] * 1e3,
                     p90_high_ms=None if interval is None else interval[1] * 1e3, timed_s=self.timed_s)
        return stats


Interval = Tuple[float, float, float]  # (p90, low, high), ms


def interval_ms(latencies_ms: Sequence[float]) -> Optional[Interval]:
    """(p90, low, high) of these timings, or None when they are too few for an interval."""
    ordered = sorted(latencies_ms)
    ranks = order_ranks(len(ordered))
    return None if ranks is None else (percentile(ordered, 90), ordered[ranks[0]], ordered[ranks[1]])


def drift(blocks: Sequence[Mapping[str, Any]], within: float = 0.0) -> Optional[Tuple[Interval, Interval]]:
    """The p90 intervals (p90, low, high; ms) of a head count's earlier and later rounds when they do not
    overlap and their p90s differ by more than ``within`` of the smaller (the device drifted between them
    by more than the calibration was asked to resolve), else None. One comparison per head count, so a
    steady device is flagged at most ~0.6 % of the time; halves too short for an interval are not compared.
    Without ``within`` a fast model's thousands of runs would call a 1 % wobble a drift."""
    if len(blocks) < 2:
        return None
    half = len(blocks) // 2
    early, late = (interval_ms([v for b in part for v in b["latencies_ms"]]) for part in (blocks[:half], blocks[half:]))
    if early is None or late is None or (early[2] >= late[1] and late[2] >= early[1]):
        return None
    if abs(late[0] - early[0]) <= within * min(early[0], late[0]):
        return None
    return early, late


@dataclass(frozen=True)
class GateRule:
    """When a round may start: the device back within these bounds of the state the calibration began in."""

    margin_c: float = 2.0  # hottest sensor at most this much above its start
    headroom: float = 0.7  # Android's forecast at most this (or the start's, if higher)
    max_wait_s: float = 120.0
    poll_s: float = 1.0


class Gate:
    """Waits, before each round, for the device's thermal state to return to the start's.

    ``read`` gives a device state as a dict (``DeviceState.to_dict``: ``max_temp_c``,
    ``android_thermal_status``, ``android_thermal_headroom``). A device with none of them is not gated
    and says so once; a reading that fails after the start (a sensor gone) is not waited on, and the
    wait record says why. Each wait record holds the start state (``start``): a resumed calibration
    passes it back as ``start``, so its rounds return to the state the first run began in, not to the
    (perhaps hot) one it resumed in.
    """

    def __init__(self, rule: GateRule, read: Callable[[], Mapping[str, Any]], clock: Callable[[], float],
                 sleep: Callable[[float], None], start: Optional[Mapping[str, Any]] = None) -> None:
        self.rule, self.read, self.clock, self.sleep = rule, read, clock, sleep
        self.start = dict(self._signals(read() if start is None else start))

    @staticmethod
    def _signals(state: Mapping[str, Any]) -> Dict[str, float]:
        keys = ("max_temp_c", "android_thermal_status", "android_thermal_headroom")
        return {k: state[k] for k in keys if isinstance(state.get(k), (int, float)) and not isinstance(state[k], bool)
                and math.isfinite(state[k])}

    @property
    def gated(self) -> bool:
        return bool(self.start)

    def _too_hot(self, now: Mapping[str, float]) -> Optional[str]:
        """Why the device is not back in its start state (None: it is); a signal it lost raises KeyError."""
        start, rule = self.start, self.rule
        if "max_temp_c" in start and now["max_temp_c"] > start["max_temp_c"] + rule.margin_c:
            return f"{now['max_temp_c']:.1f} °C, over {start['max_temp_c']:.1f} + {rule.margin_c:g}"
        if "android_thermal_status" in start and now["android_thermal_status"] > start["android_thermal_status"]:
            return f"thermal status {now['android_thermal_status']:g}, over {start['android_thermal_status']:g}"
        limit = max(rule.headroom, start.get("android_thermal_headroom", rule.headroom))
        if "android_thermal_headroom" in start and now["android_thermal_headroom"] > limit:
            return f"headroom {now['android_thermal_headroom']:.2f}, over {limit:.2f}"
        return None

    def wait(self) -> Dict[str, Any]:
        """Wait until the device is back (or ``max_wait_s`` passed); the record of the wait."""
        return {**self._wait(), "start": dict(self.start)}

    def _wait(self) -> Dict[str, Any]:
        if not self.gated:
            return {"waited_s": 0.0, "outcome": "ungated", "why": "the device reports no temperature"}
        began, why = self.clock(), None
        while True:
            now = self._signals(self.read())
            try:
                why = self._too_hot(now)
            except KeyError as e:
                return {"waited_s": self.clock() - began, "outcome": "reading failed",
                        "why": f"the device no longer reports {e.args[0]}", "state": now}
            waited = self.clock() - began
            if why is None:
                return {"waited_s": waited, "outcome": "ready", "state": now}
            if waited >= self.rule.max_wait_s:
                return {"waited_s": waited, "outcome": "timeout", "why": why, "state": now}
            self.sleep(min(self.rule.poll_s, self.rule.max_wait_s - waited))


def interleave(tallies: Mapping[int, Tally], time_block: Callable[[int], Sequence[float]], rule: StopRule,
               clock: Callable[[], float], rng: random.Random, gate: Optional[Gate] = None, first_round: int = 1,
               on_round: Callable[[Dict[str, Any]], None] = lambda event: None,
               on_block: Callable[[Tally], None] = lambda tally: None) -> None:
    """Time every open tally in rounds until each has stopped.

    Each round waits on ``gate`` (when given), then visits the open head counts in a new random order;
    ``time_block(heads)`` times one block (its own warm-up untimed) and returns the runs' latencies in
    seconds. ``on_round`` gets the round's record before its blocks, ``on_block`` each tally after its block
    (judged: ``stopped`` set once it is done).
    """
    round_no, began = first_round, clock()
    while True:
        open_heads = [h for h, t in sorted(tallies.items()) if t.stopped is None]
        if not open_heads:
            return
        order = rng.sample(open_heads, len(open_heads))
        on_round({"round": round_no, "order": order, "started_s": clock() - began,
                  "gate": gate.wait() if gate is not None else None})
        for heads in order:
            start = clock()
            latencies = time_block(heads)
            tally = tallies[heads]
            tally.add(round_no, latencies, clock() - start)
            tally.judge(rule)
            on_block(tally)
        round_no += 1


def timed_block(step: Callable[[], Any], clock: Callable[[], float], warmup: int, block_s: float) -> List[float]:
    """``warmup`` untimed runs, then runs until at least ``MIN_BLOCK_RUNS`` and ``block_s`` of them."""
    for _ in range(warmup):
        step()
    latencies: List[float] = []
    total = 0.0  # kept as it goes: summing the list after every run is quadratic in a block of fast runs
    while len(latencies) < MIN_BLOCK_RUNS or total < block_s:
        start = clock()
        step()
        latencies.append(clock() - start)
        total += latencies[-1]
    return latencies


def recorded_start(rounds: Sequence[Any]) -> Optional[Dict[str, Any]]:
    """The gate's start state as a calibration's first round with one recorded it (the record's ``Round``
    objects); None when no round recorded one (none yet, or made before the start was recorded)."""
    for round_ in rounds:
        if isinstance(round_.gate, Mapping) and isinstance(round_.gate.get("start"), Mapping):
            return dict(round_.gate["start"])
    return None
