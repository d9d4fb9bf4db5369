"""What the host makes of a calibration by rounds: the time it has left, and the lines a user must read
(a head count whose cap ran out before its p90 was known, one whose rounds disagree, rounds the thermal
gate could not hold back)."""

from __future__ import annotations

from ..calibration_plan import drift, interval_ms
from ..records.calibration import Calibration, HeadResult


def _latencies(result: HeadResult) -> list[float]:
    return [v for block in result.blocks or [] for v in block.latencies_ms]


def time_left(calibration: Calibration, within: float, cap_s: float) -> float | None:
    """Seconds the head counts still timing need, roughly: an interval narrows as 1/sqrt(runs), so one
    at ±w after n runs needs n (w / within)^2; each at its own time per run, never past its cap. None
    until every one of them has an interval to go by."""
    left = 0.0
    for result in calibration.results:
        if result.status != "timing":
            continue
        latencies, spent = _latencies(result), sum(b.spent_s for b in result.blocks or [])
        known = interval_ms(latencies)
        if known is None:
            return None
        p90, low, high = known
        half = max(p90 - low, high - p90) / p90 if p90 > 0 else 0.0
        needed = len(latencies) * max(1.0, (half / within) ** 2)
        per_run = spent / len(latencies)
        left += max(0.0, min(cap_s - spent, (needed - len(latencies)) * per_run))
    return left


def findings(calibration: Calibration) -> list[str]:
    """One line for each thing about the rounds that the numbers alone do not say."""
    lines = []
    within = ((calibration.settings.get("rounds") or {}).get("within"))
    for r in calibration.results:
        if r.stopped == "cap":
            interval, count = r.p90_interval_ms, (r.latency or {}).get("count")
            p90 = (r.latency or {}).get("p90_ms") or 0.0
            if interval is None:
                lines.append(f"{r.heads} heads: its cap ran out after {count} runs, too few for a p90 interval; "
                             "the table plans on its slowest run; raise --cap-seconds")
            else:
                half = max(p90 - interval[0], interval[1] - p90) / p90 * 100 if p90 else 0.0
                lines.append(f"{r.heads} heads: its cap ran out with its p90 known to ±{half:.1f} %, not "
                             f"±{(within or 0) * 100:g} % ({count} runs); the table plans on the interval's upper "
                             f"end ({interval[1]:.3f} ms); raise --cap-seconds for a tighter one")
        elif r.stopped == "runs":
            lines.append(f"{r.heads} heads: {(r.latency or {}).get('count')} runs, the most a head count keeps, did "
                         f"not bring its p90's interval within ±{(within or 0) * 100:g} %: its timings spread more "
                         "than that (a busy or throttling device); the table plans on the interval's upper end")
        split = drift([{"latencies_ms": b.latencies_ms} for b in r.blocks or []], within or 0.0)
        if split is not None:
            (p1, l1, h1), (p2, l2, h2) = split
            lines.append(f"{r.heads} heads: its earlier rounds' p90 ({p1:.3f} ms, {l1:.3f}-{h1:.3f}) and its later "
                         f"rounds' ({p2:.3f} ms, {l2:.3f}-{h2:.3f}) disagree: the device drifted while it was "
                         "timed; calibrate again on a quiet, cool device")
    gates = [(round_.round, round_.gate) for round_ in calibration.rounds or [] if round_.gate]
    if any(g.get("outcome") == "ungated" for _, g in gates):
        lines.append("the device reports no temperature: its rounds were not gated on the thermal state")
    timeouts = [(n, g) for n, g in gates if g.get("outcome") == "timeout"]
    if timeouts:
        n, g = timeouts[0]
        lines.append(f"{len(timeouts)} round(s) started before the device was back in its start state, after "
                     f"waiting {g.get('waited_s', 0):.0f} s (first: round {n}, {g.get('why')}); give it longer "
                     "with --gate-max-wait")
    failed = [(n, g) for n, g in gates if g.get("outcome") == "reading failed"]
    if failed:
        n, g = failed[0]
        lines.append(f"{len(failed)} round(s) were not gated: {g.get('why')} (from round {n})")
    return lines
