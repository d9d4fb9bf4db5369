"""The latency governor: lower the head count when the device runs slower than its table planned.

The lookup table comes from one calibration; in service the same head count can run slower for
reasons the table cannot know (another process on the same cores, a governor change, an OS
update, a hotter room). The governor watches the timings of the inferences actually run and puts
a cap on the head count; the switcher runs ``min(the table's choice after the fail-safe rules,
cap)``, so the governor only ever takes heads away from what the table allows, never adds any.

Rules, on the caller's clock and timings (pure logic: tests drive it with a fake clock):

* Per head count, a p90 over the timings of the last ``window_s`` (at most ``max_samples`` of
  them; at least ``min_samples`` before it counts): bounded memory whatever the inference rate.
* A head count without timings of its own in the window is predicted from the running one's. A
  smaller one: its calibrated latency times the running one's p90 over its calibrated latency. A
  larger one, from the running one's timings up to their p90: its calibrated latency times their
  mean over the running one's calibrated latency (the slow-down that grows with the work), plus the
  p90's excess over that mean in ms as it is (the scheduler's jitter, per-inference overheads: they
  do not grow with the work). On a head count of a millisecond or two the jitter is most of the p90;
  scaled by 10 with the rest, it predicted 12 heads over budget long after a load had gone. Timings
  all alike predict calibrated x p90 / calibrated either way.
* Down: when the running head count's p90 has stayed over the budget for ``sustain_s``, the cap
  becomes the largest head count below it predicted to fit (its own windowed p90 where it has one);
  none predicted to fit: the smallest.
* Up, while the cap holds the head count below the table's choice and its p90 fits: once a larger
  head count (up to the table's choice) has been predicted to fit for ``dwell_s``, the largest such
  one is probed for ``probe_inferences`` inferences: kept when their p90 fits, else back down, and
  the next probe tries at most one head count below the one that failed. Each failed probe of a
  head count doubles the dwell before it is probed again (up to 8 x ``dwell_s``, until a probe of it
  is kept), so a head count that never fits costs ``probe_inferences`` inferences over budget every
  8 x ``dwell_s`` at most. A prediction is no measurement: when none is predicted to fit but the
  running head count's p90 has fitted for 8 x ``dwell_s``, the most heads the next probe may try are
  probed all the same (a failure there doubles nothing: it comes at the longest dwell already).
* Back after a load, from these rules: with the table's choice H fitting, and k (0..3) failed probes
  of H since one was kept (0 when none failed during the load), H is back within
  ``window_s`` + 2^k x ``dwell_s`` + its probe's inferences of the load ending when the running
  head count's timings, the load forgotten, predict H to fit; whatever they predict, within
  ``window_s`` + 8 x ``dwell_s`` + the probe. Both as the switch-rate limit allows: a probe waits
  until it and its undoing fit in it, so with 4 changes a minute a step down and a probe that failed
  during the load hold the next probe until the step down is a minute old. With ``window_s`` 2,
  ``dwell_s`` 4 and 12 heads calibrated at 13.7 ms against a budget of 20 ms, 3 heads calibrated at
  1.3 ms and timed at 1.3-2.2 ms: within 6.3 s (tests/test_latency_recovery.py).
* At most ``max_switches_per_minute`` changes of the cap in any 60 s (a probe is started only
  when it may also be undone); never below the smallest head count.
* A timing that is NaN, infinite, negative or over ``absurd_ms`` (a clock jump, a suspended
  process) is ignored and counted by kind, and logged once per kind.

The budget is the table's (``budget_ms`` x the battery band's scale), held to the p90: a table
planned on the median with less headroom than the device's tail gets capped too.
Numpy-free and torch-free (the standard library), because boards run it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from ..errors import HydraEdgeError
from ..records.correction import LearnedLatency
from .latency import percentile

MINUTE_S = 60.0
MAX_BACKOFF_DOUBLINGS = 3  # a head count that keeps failing its probe is tried every 8 x dwell_s at most


def check_budget(budget_ms: Any, where: str) -> float:
    """``budget_ms`` as a float if it is a positive, finite number of ms; one ``HydraEdgeError`` line otherwise."""
    if isinstance(budget_ms, bool) or not isinstance(budget_ms, (int, float)) or not 0 < budget_ms < math.inf:
        raise HydraEdgeError(f"{where}: a latency budget of {budget_ms!r} ms cannot be met; give the time one "
                             "inference may take as a positive number of milliseconds (e.g. 80)")
    return float(budget_ms)


@dataclass(frozen=True)
class LoopSettings:
    """The loop's numbers (defaults suit a board running a few inferences a second or more)."""

    budget_ms: Optional[float] = None  # None: the table's budget_ms; either way scaled by the battery band
    window_s: float = 5.0  # the p90 is over the timings of this long
    sustain_s: float = 10.0  # how long the p90 must stay over budget before the head count falls: a
    # burst shorter than sustain_s - 0.8 x window_s (6 s) moves nothing
    dwell_s: float = 30.0  # how long a larger head count must have been predicted to fit before it is
    # probed (doubled after each failed probe of it, up to 8 x); with none predicted, the running head
    # count's p90 fitting for 8 x dwell_s probes more heads all the same
    probe_inferences: int = 20  # how many inferences a probe runs before it is judged
    max_switches_per_minute: int = 4  # changes of the cap in any 60 s; at least 2 (a probe and its undoing)
    min_samples: int = 5  # fewer timings in the window: no p90 yet (so the loop needs 1 inference/s or more)
    max_samples: int = 256  # per head count: the memory bound
    absurd_ms: float = 60_000.0  # a timing over this is no inference's: ignored and counted
    expire_s: float = 3600.0  # a saved correction older than this is not used after a restart

    def __post_init__(self) -> None:
        if self.budget_ms is not None:
            check_budget(self.budget_ms, "the latency loop's budget_ms")
        least = {"max_switches_per_minute": 2}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "budget_ms":
                continue
            if f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < least.get(f.name, 1):
                    raise HydraEdgeError(f"latency loop setting {f.name} = {value!r}: must be a whole number of at "
                                         f"least {least.get(f.name, 1)}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise HydraEdgeError(f"latency loop setting {f.name} = {value!r}: must be a positive number of "
                                     f"{'ms' if f.name.endswith('_ms') else 'seconds'}")
        if self.min_samples > self.max_samples:
            raise HydraEdgeError(f"latency loop settings: min_samples ({self.min_samples}) is more than "
                                 f"max_samples ({self.max_samples}); the p90 could never be taken")


@dataclass
class _Probe:
    heads: int  # the head count on trial
    back_to: int  # the cap to return to if it fails
    predicted: bool  # False: probed though not predicted to fit; a failure doubles no dwell
    timings: List[float]


@dataclass(frozen=True)
class Slowdown:
    """What the running head count's windowed timings say about a larger head count's latency.

    Its timings up to their p90: their mean over its calibrated latency (``scale``) is the slow-down
    that grows with the work (a core shared with another process slows every inference in proportion,
    on average, a short one by being caught now and then); the p90's excess over that mean
    (``spread_ms``: the scheduler's jitter, per-inference overheads) does not, and is added in ms.
    """

    scale: float
    spread_ms: float

    @classmethod
    def of(cls, timings: List[float], calibrated_ms: float) -> "Slowdown":
        """From sorted timings (ms) of a head count calibrated at ``calibrated_ms``."""
        p90 = percentile(timings, 90)
        below = [ms for ms in timings if ms <= p90]
        shortfall = 0.0
        for ms in below:  # summed in order, not by sum(): the Kotlin governor must get the same bits
            shortfall += p90 - ms
        shortfall /= len(below)
        return cls((p90 - shortfall) / calibrated_ms, shortfall)  # timings all alike: p90 / calibrated, 0

    def predict(self, calibrated_ms: float) -> Tuple[float, str]:
        """A head count calibrated at ``calibrated_ms``: its predicted p90 and how it was predicted."""
        spread = f" + {self.spread_ms:.3g} ms spread" if self.spread_ms else ""
        return (calibrated_ms * self.scale + self.spread_ms,
                f"calibrated {calibrated_ms:.3g} ms x {self.scale:.2f}{spread}")


class LatencyGovernor:
    """The cap on the head count, from observed timings (see the module docstring).

    ``calibrated_ms``: each candidate head count's calibrated latency from the table (positive).
    ``restored``: learned timings saved by an earlier run (``hydra_edge.runtime.closed_loop``) and
    their age in seconds; the first ``step`` caps the head count by them.
    """

    def __init__(self, calibrated_ms: Mapping[int, float], settings: LoopSettings, log: logging.Logger,
                 restored: Optional[Tuple[Mapping[int, LearnedLatency], float]] = None) -> None:
        self.calibrated = dict(sorted(calibrated_ms.items()))
        self.order = tuple(self.calibrated)  # fewest heads first
        self.settings, self.log = settings, log
        self.cap = self.order[-1]
        self.learned: Dict[int, LearnedLatency] = dict(restored[0]) if restored else {}
        self.revision = 0  # counts changes to ``learned`` that a saved copy lacks
        self.ignored: Dict[str, int] = {}
        self.decisions: Deque[Tuple[float, str]] = deque(maxlen=20)  # (time, reason), the newest last
        self._restored_age = restored[1] if restored else None
        self._samples: Dict[int, Deque[Tuple[float, float]]] = {
            h: deque(maxlen=settings.max_samples) for h in self.order}
        self._over_since: Optional[float] = None
        self._under_since: Optional[float] = None  # since a larger head count has been predicted to fit
        self._within_since: Optional[float] = None  # since the running one has fitted, held below the table
        self._probe: Optional[_Probe] = None
        self._probe_limit: Optional[int] = None  # the most heads the next probe may try, after one failed
        self._failed: Dict[int, int] = {}  # failed probes per head count since one of it was kept
        self._switches: Deque[float] = deque()

    # -- timings --------------------------------------------------------------------------------

    def observe(self, heads: int, ms: float, now: float) -> bool:
        """Record one inference's latency in ms; False (and counted) when it is garbage."""
        why = self._garbage(heads, ms)
        if why is not None:
            self.ignored[why] = self.ignored.get(why, 0) + 1
            if self.ignored[why] == 1:
                self.log.warning("ignoring a latency of %r ms for %r heads (%s); further ones are counted, not logged",
                                 ms, heads, why)
            return False
        if self._probe is not None and heads == self._probe.heads:
            self._probe.timings.append(float(ms))
        self._samples[heads].append((now, float(ms)))
        return True

    def _garbage(self, heads: int, ms: float) -> Optional[str]:
        if heads not in self._samples:
            return "not a head count of the table"
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or math.isnan(ms):
            return "not a number"
        if math.isinf(ms):
            return "infinite"
        if ms < 0:
            return "negative"
        if ms > self.settings.absurd_ms:
            return f"over {self.settings.absurd_ms:g} ms"
        return None

    def p90(self, heads: int, now: float) -> Optional[float]:
        """The p90 of ``heads``' timings in the window, or None with fewer than ``min_samples``."""
        timings = self._window(heads, now)
        return None if timings is None else percentile(timings, 90)

    def _window(self, heads: int, now: float) -> Optional[List[float]]:
        """``heads``' timings in the window, sorted, or None with fewer than ``min_samples``."""
        samples = self._samples[heads]
        while samples and samples[0][0] < now - self.settings.window_s:
            samples.popleft()
        if len(samples) < self.settings.min_samples:
            return None
        return sorted(ms for _, ms in samples)

    # -- the cap --------------------------------------------------------------------------------

    def limit(self, ceiling: int) -> int:
        """The head count to run: the table's choice (after the fail-safe rules), or the cap if lower."""
        return min(ceiling, self.cap)

    def step(self, running: int, ceiling: int, budget_ms: float, now: float) -> Optional[str]:
        """Judge the timings so far; the reason when the cap changed or a probe was judged, else None.

        ``running``: the head count running now; ``ceiling``: the most the table and the fail-safe
        rules allow now; ``budget_ms``: the budget for the current battery band.
        """
        if self._restored_age is not None:
            return self._restore(budget_ms, now)
        if self._probe is not None:
            return self._judge_probe(running, budget_ms, now)
        timings = self._window(running, now)
        if timings is None:
            return None
        p90 = percentile(timings, 90)
        if p90 > budget_ms:
            self._under_since = self._within_since = None
            return self._over(running, p90, budget_ms, now)
        self._over_since = None
        return self._under(running, ceiling, timings, p90, budget_ms, now)

    def _over(self, running: int, p90: float, budget_ms: float, now: float) -> Optional[str]:
        if self._over_since is None:
            self._over_since = now
        held = now - self._over_since
        if held < self.settings.sustain_s or running == self.order[0] or not self._may_switch(now, 1):
            return None
        seen = Slowdown(p90 / self.calibrated[running], 0.0)  # down: the p90's slow-down, spread and all
        predictions = self._predictions([h for h in self.order if h < running], seen, now)
        target, predicted, basis = next((p for p in reversed(predictions) if p[1] <= budget_ms), predictions[0])
        self._learn(running, p90, len(self._samples[running]))
        self._over_since, self._probe_limit = None, None
        self.cap = target
        return self._decided(now, f"latency p90 {p90:.3g} ms over budget {budget_ms:.3g} ms for {held:.0f} s at "
                                  f"{running} heads: {target} heads, predicted {predicted:.3g} ms ({basis})")

    def _under(self, running: int, ceiling: int, timings: List[float], p90: float, budget_ms: float,
               now: float) -> Optional[str]:
        if self.cap >= ceiling:  # the cap holds nothing down: the table's choice runs
            self._under_since = self._within_since = None
            return None
        if self._within_since is None:
            self._within_since = now
        if self._probe_limit is not None and self._probe_limit <= running:
            self._probe_limit = None  # every head count between was tried: the next probe may try them all again
        top = min(ceiling, self._probe_limit if self._probe_limit is not None else ceiling)
        seen = Slowdown.of(timings, self.calibrated[running])
        predictions = self._predictions([h for h in self.order if running < h <= top], seen, now)
        fitting = [p for p in predictions if p[1] <= budget_ms]
        if fitting:
            if self._under_since is None:
                self._under_since = now
            gone = now - self._under_since
            heads, predicted, _ = fitting[-1]
            dwell = self.settings.dwell_s * 2 ** min(self._failed.get(heads, 0), MAX_BACKOFF_DOUBLINGS)
            if gone < dwell or not self._may_switch(now, 2):
                return None
            return self._start_probe(heads, running, True, now, f"latency back under budget for {gone:.0f} s "
                                     f"({running} heads p90 {p90:.3g} ms, {heads} heads predicted {predicted:.3g} ms)")
        self._under_since = None
        within = now - self._within_since
        if within < self.settings.dwell_s * 2 ** MAX_BACKOFF_DOUBLINGS or not self._may_switch(now, 2):
            return None
        heads, predicted, basis = predictions[-1]
        return self._start_probe(heads, running, False, now, f"latency within budget for {within:.0f} s at {running} "
                                 f"heads (p90 {p90:.3g} ms), {heads} heads predicted {predicted:.3g} ms ({basis}), "
                                 "which only a probe can tell")

    def _start_probe(self, heads: int, running: int, predicted: bool, now: float, why: str) -> str:
        self._probe = _Probe(heads, running, predicted, [])
        self._under_since = self._within_since = None
        self.cap = heads
        return self._decided(now, f"{why}: probing {heads} heads for {self.settings.probe_inferences} inferences")

    def _judge_probe(self, running: int, budget_ms: float, now: float) -> Optional[str]:
        probe = self._probe
        assert probe is not None
        if running != probe.heads:  # the table or a fail-safe rule lowered the head count: no verdict
            self._probe, self.cap = None, probe.back_to
            if probe.back_to >= running:
                return None
            return self._decided(now, f"probe of {probe.heads} heads ended by the table's choice ({running} heads): "
                                      f"back to {probe.back_to} heads")
        if len(probe.timings) < self.settings.probe_inferences:
            return None
        self._probe = None
        p90 = percentile(sorted(probe.timings), 90)
        self._learn(probe.heads, p90, len(probe.timings))
        if p90 <= budget_ms:
            self._probe_limit = None
            self._failed.pop(probe.heads, None)
            reason = (f"probe of {probe.heads} heads: p90 {p90:.3g} ms within budget {budget_ms:.3g} ms over "
                      f"{len(probe.timings)} inferences: keeping {probe.heads} heads")
            self.decisions.append((now, reason))
            self.log.info("%s", reason)
            return reason
        below = self.order[self.order.index(probe.heads) - 1]
        self._probe_limit, self.cap = below, probe.back_to
        if probe.predicted:
            self._failed[probe.heads] = self._failed.get(probe.heads, 0) + 1
        return self._decided(now, f"probe of {probe.heads} heads: p90 {p90:.3g} ms over budget {budget_ms:.3g} ms; "
                                  f"back to {probe.back_to} heads")

    def _restore(self, budget_ms: float, now: float) -> Optional[str]:
        """The first step after a restart: cap by the saved correction, as a step down would have."""
        age, self._restored_age = self._restored_age, None
        if not self.learned:
            return None
        slowdown = max(entry.slowdown for entry in self.learned.values())

        def predicted(heads: int) -> float:
            entry = self.learned.get(heads)
            return entry.p90_ms if entry is not None else self.calibrated[heads] * slowdown

        fits = [h for h in self.order if predicted(h) <= budget_ms]
        self.cap = fits[-1] if fits else self.order[0]
        if self.cap == self.order[-1]:
            return None
        over = self.order[self.order.index(self.cap) + 1]
        return self._decided(now, f"latency correction saved {age:.0f} s ago: {over} heads predicted "
                                  f"{predicted(over):.3g} ms, over budget {budget_ms:.3g} ms: at most {self.cap} heads")

    # -- helpers --------------------------------------------------------------------------------

    def _predictions(self, candidates: List[int], seen: Slowdown, now: float) -> List[Tuple[int, float, str]]:
        """Each of ``candidates`` (ascending, not empty) with its predicted p90 and how: its own windowed
        p90 where it has one, else from what the running head count's timings show (``seen``)."""
        out = []
        for h in candidates:
            observed = self.p90(h, now)
            out.append((h, observed, "observed p90") if observed is not None
                       else (h, *seen.predict(self.calibrated[h])))
        return out

    def _learn(self, heads: int, p90: float, samples: int) -> None:
        self.learned[heads] = LearnedLatency(heads=heads, p90_ms=p90, slowdown=p90 / self.calibrated[heads],
                                             samples=samples)
        self.revision += 1

    def _may_switch(self, now: float, needed: int) -> bool:
        """Whether ``needed`` more changes of the cap keep within ``max_switches_per_minute``."""
        while self._switches and self._switches[0] <= now - MINUTE_S:
            self._switches.popleft()
        return len(self._switches) + needed <= self.settings.max_switches_per_minute

    def _decided(self, now: float, reason: str) -> str:
        self._switches.append(now)
        self.decisions.append((now, reason))
        self.log.info("%s", reason)
        return reason

    def status(self, now: float) -> Dict[str, Any]:
        """JSON-ready: the cap, the probe, each head count's windowed p90, what was ignored and why."""
        return {"cap": self.cap, "probing": None if self._probe is None else self._probe.heads,
                "p90_ms": {h: self.p90(h, now) for h in self.order}, "ignored": dict(self.ignored),
                "decisions": [{"time": t, "reason": r} for t, r in self.decisions]}
