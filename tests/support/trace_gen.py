"""Random but valid phone traces: what an adversary would script to make the two switchers disagree.

``trace(rng)`` draws a table within the schema (head counts, latencies, budget, the soak's derating and
a policy: battery bands, margins, dwell), fail-safe settings (stale_after_s, raise_after_s, assumed_hot,
a phone that does or does not read the headroom), latency loop settings or none, a monotonic and a wall
clock, then steps: polls whose thermal status, headroom and battery fail, print NaN, go out of range or
sit exactly on a band's edge or margin; inferences whose timings are garbage, equal for a whole window
or drawn around the table's; stretches of serving, restarts and spoiled corrections. Readings persist for
a while and change a little at a time, as a phone's do, so the rules that need time (stale, raise,
dwell, sustain, probes) are reached. The wall clock that dates corrections may start before 1970, and a
table may be spoiled (damaged, another bundle's, hotter cells with more heads, built on temperature).
``rng`` is a ``random.Random``: seeded for the differential batches, or Hypothesis's, which then shrinks
a failing trace.
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional

from hydra_edge.records.fields import ANDROID_THERMAL_STATUSES

Trace = Dict[str, Any]
Reading = Dict[str, Any]

# Android's BatteryManager.BATTERY_STATUS_*: 1 unknown, 2 charging, 3 discharging, 4 not charging, 5 full
BATTERY_STATUSES = (1, 2, 3, 4, 5)
# Headroom forecasts that sit on a rule's edge: severe at 1.0, the valid range 0..10, below a float's
# smallest normal (a denormal: garbage), NaN and the infinities; None is the HAL's Error: answer
HEADROOM_EDGES = (0.0, -0.0, 1.0, 0.9999999403953552, 1.0000001192092896, 10.0, 10.000000953674316, -1e-7,
                  1e-40, 1.1754943508222875e-38, 1e-320, "nan", "inf", "-inf", None)
# Timings no inference takes (NaN, infinite, negative) or that are suspect (0, huge)
GARBAGE_MS = ("nan", "inf", "-inf", -1.0, -1e-9, 0.0, 1e300)
SPOILS = ("damaged", "truncated", "foreign_lut", "foreign_manifest", "future", "unknown_heads", "negative_p90",
          "unknown_field", "folder", "delete")


def table(rng: random.Random) -> Dict[str, Any]:
    """A table spec ``support.tables.lut_document`` builds: rising latencies, a budget some or none meet,
    a soak derating, the headroom named or not, and a policy of random bands, margins and dwell."""
    heads = sorted(rng.sample(range(1, 13), rng.randint(1, 5)))
    per_head = rng.choice([0.1, 1.0, 3.3, 10.0, rng.uniform(0.05, 50.0)])
    latency: Dict[str, float] = {}
    last = 0.0
    for h in heads:
        last = round(max(last * 1.01 + 1e-3, per_head * h * rng.uniform(0.7, 1.3)), 4)
        latency[str(h)] = last
    slowest = last
    budget = round(rng.choice([slowest * 1.05, slowest * rng.uniform(0.2, 2.5), latency[str(heads[0])] * 0.5,
                               slowest * 10]), 4)
    derating = [1.0]
    for _ in range(3):
        derating.append(round(derating[-1] * rng.uniform(1.0, 2.0), 3))
    mins = sorted(rng.sample(range(1, 100), rng.randint(0, 3)), reverse=True) + [0]
    policy = {
        "min_dwell_s": rng.choice([0.0, 1.0, 5.0, rng.uniform(0.0, 30.0)]),
        "battery": {"margin_pct": rng.choice([0.0, 5.0, rng.uniform(0.0, 20.0)]),
                    "charging_budget_scale": rng.choice([1.0, rng.uniform(0.5, 2.0)]),
                    "bands": [{"min_pct": float(m), "budget_scale": round(rng.uniform(0.3, 1.5), 3)} for m in mins]},
        "thermal": {"android_derating": sorted(round(rng.uniform(1.0, 5.0), 3) for _ in ANDROID_THERMAL_STATUSES)},
    }
    return {"latency_ms": latency, "budget_ms": budget, "headroom": rng.random() < 0.6, "policy": policy,
            "by_thermal_status": dict(zip(ANDROID_THERMAL_STATUSES, derating))}


def loop_settings(rng: random.Random) -> Dict[str, Any]:
    """LoopSettings within their checks, often quick enough for a short trace to reach every rule."""
    min_samples = rng.randint(1, 8)
    settings = {"window_s": rng.choice([0.5, 2.0, 5.0, rng.uniform(0.2, 10.0)]),
                "sustain_s": rng.choice([0.5, 3.0, rng.uniform(0.1, 15.0)]),
                "dwell_s": rng.choice([0.5, 4.0, rng.uniform(0.1, 20.0)]),
                "probe_inferences": rng.randint(1, 25), "max_switches_per_minute": rng.randint(2, 8),
                "min_samples": min_samples, "max_samples": rng.randint(min_samples, 300),
                "absurd_ms": rng.choice([60_000.0, rng.uniform(20.0, 500.0)]),
                "expire_s": rng.choice([3600.0, rng.uniform(1.0, 120.0)])}
    if rng.random() < 0.2:
        settings["budget_ms"] = round(rng.uniform(0.5, 100.0), 3)
    return settings


class Script:
    """Draws one trace's steps, keeping the phone's reading and the table's numbers at hand."""

    def __init__(self, rng: random.Random, spec: Dict[str, Any], signals: Dict[str, Any]) -> None:
        self.rng, self.spec, self.signals = rng, spec, signals
        self.latencies = [float(v) for v in spec["latency_ms"].values()]
        bands = [b["min_pct"] for b in spec["policy"]["battery"]["bands"]]
        margin = spec["policy"]["battery"]["margin_pct"]
        # battery levels on and beside each band's edge and its margin (levels are whole %)
        self.levels = sorted({int(x) for m in bands for x in (m - 1, m, m + 1, m + margin, m + margin + 1)
                              if 0 <= x <= 100} | {0, 100})
        self.reading: Reading = self.fresh()
        self.steps: List[Dict[str, Any]] = []

    def fresh(self) -> Reading:
        rng = self.rng
        return {"status": rng.choice([*range(7), *range(7), None, -1, 7]),
                "headroom": rng.choice([rng.uniform(0.0, 1.5), rng.uniform(0.0, 0.99), *HEADROOM_EDGES]),
                "level": rng.choice([rng.randint(0, 100), *self.levels, None, -1, 101]),
                "battery_status": rng.choice([*BATTERY_STATUSES, 3, 3, None])}

    def nudge(self) -> Reading:
        """The reading a little later: one signal moves by a step, fails or recovers."""
        rng, reading = self.rng, dict(self.reading)
        key = rng.choice(["status", "headroom", "level", "battery_status"])
        value = reading[key]
        if key == "status":
            reading[key] = rng.choice([None, -1, 7]) if rng.random() < 0.15 else \
                min(6, max(0, (value if isinstance(value, int) and 0 <= value <= 6 else 0) + rng.choice([-1, 1])))
        elif key == "headroom":
            reading[key] = rng.choice(HEADROOM_EDGES) if rng.random() < 0.3 else \
                round(max(0.0, (value if isinstance(value, float) and 0 <= value <= 10 else 0.5)
                          + rng.uniform(-0.3, 0.3)), 4)
        elif key == "level":
            reading[key] = rng.choice([None, -1, 101, *self.levels]) if rng.random() < 0.3 else \
                min(100, max(0, (value if isinstance(value, int) and 0 <= value <= 100 else 50) + rng.choice([-1, 1])))
        else:
            reading[key] = rng.choice([*BATTERY_STATUSES, None])
        return reading

    def dt(self) -> float:
        """A pause that lands on the fail-safe and dwell rules' edges as often as between them."""
        rng = self.rng
        edges = [self.signals.get("stale_after_s", 30.0), self.signals.get("raise_after_s", 10.0),
                 self.spec["policy"]["min_dwell_s"]]
        return rng.choice([0.0, 0.1, 0.5, 1.0, 1.0, *edges, rng.choice(edges) + rng.choice([-1e-6, 1e-6]),
                           rng.uniform(0.0, 5.0), rng.uniform(0.0, 120.0)])

    def timing(self) -> Any:
        rng = self.rng
        if rng.random() < 0.1:
            return rng.choice(GARBAGE_MS)
        return round(rng.choice(self.latencies) * rng.choice([1.0, rng.uniform(0.3, 3.0)]), 6)

    def step(self) -> None:
        rng, spec = self.rng, self.spec
        roll = rng.random()
        if roll < 0.3:
            self.reading = self.fresh() if rng.random() < 0.2 else self.nudge()
            self.steps.append({"dt": self.dt(), "poll": self.reading})
        elif roll < 0.5:
            self.steps.append({"dt": rng.choice([0.0, 0.05, 0.1, self.dt()]), "infer": self.timing()})
        elif roll < 0.6:  # a window of equal timings: the p90 is each of them
            ms = rng.choice([13.8, 0.1 * rng.randint(1, 200), rng.choice(self.latencies)])
            self.steps.append({"repeat": rng.randint(2, 40), "steps": [{"dt": rng.choice([0.05, 0.1, 0.25]),
                                                                        "infer": ms}]})
        elif roll < 0.8:
            if rng.random() < 0.5:
                self.reading = self.nudge()
            serve: Dict[str, Any] = {"seconds": round(rng.uniform(0.5, 12.0), 3), "reading": self.reading,
                                     "rate_hz": rng.choice([2.0, 5.0, 10.0, rng.uniform(1.0, 25.0)]),
                                     "poll_every_s": rng.choice([0.5, 1.0, 2.0]),
                                     "factor": rng.choice([1.0, 0.5, 1.5, 3.0, rng.uniform(0.2, 4.0)])}
            if rng.random() < 0.3:
                serve["ms"] = {h: round(float(v) * rng.uniform(0.5, 4.0), 4) for h, v in spec["latency_ms"].items()
                               if rng.random() < 0.5}
            self.steps.append({"serve": serve})
        elif roll < 0.88:
            self.steps.append({"dt": self.dt(), "wall_dt": rng.choice([0.0, 1.0, 60.0, -60.0, 7200.0, -1e6])})
        elif roll < 0.94:
            self.steps.append({"dt": rng.choice([0.0, self.dt()]), "restart": True})
        else:
            self.steps.append({"spoil_correction": rng.choice(SPOILS)})


def trace(rng: random.Random, steps: Optional[int] = None) -> Trace:
    """One random trace (see the module docstring); ``steps``: how many (default 5..40)."""
    spec = table(rng)
    signals: Dict[str, Any] = {"stale_after_s": rng.choice([0.5, 1.0, 5.0, 30.0, round(rng.uniform(0.1, 60.0), 3)]),
                               "raise_after_s": rng.choice([0.0, 1.0, 10.0, round(rng.uniform(0.0, 60.0), 3)])}
    if rng.random() < 0.3:
        signals["assumed_hot"] = rng.choice([0.0, 1.0, 3.0, 4.0, 6.0, 2.5, -1.0, 100.0])
    if rng.random() < 0.2:
        signals["headroom"] = False
    script = Script(rng, spec, signals)
    script.steps.append({"t": rng.choice([0.0, 1000.0, round(rng.uniform(0.0, 1e9), 3)]), "poll": script.reading}
                        if rng.random() < 0.8 else {"infer": script.timing()})
    for _ in range(steps if steps is not None else rng.randint(5, 40)):
        script.step()
    out: Trace = {"about": "generated", "covers": [], "table": spec, "signals": signals,
                  "clock": 1000.0, "wall": rng.choice([1.75e9, round(rng.uniform(1e9, 2e9), 3), -86400.0, 0.0]),
                  "steps": script.steps}
    if rng.random() < 0.7:
        out["loop"] = loop_settings(rng)
    if rng.random() < 0.05:
        out["lut_spoil"] = rng.choice(["damaged", "foreign_manifest", "hotter_cell_with_more_heads",
                                       "temperature_source"])
    return out
