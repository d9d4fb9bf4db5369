"""A simulated device for the calibration plan: a fake clock, and an engine whose speed falls as the
device warms and recovers as it cools, with an optional background task that slows it for a while.

Temperature approaches ``hot`` while an inference runs and ``ambient`` while idle (first order, time
constants ``tau_heat_s`` and ``tau_cool_s``); each degree above ``ambient`` slows inference by
``slow_per_c``. Latencies are lognormal around each head count's ``base_ms``, so the true cool p90 is
known exactly (``true_p90_ms``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

Z90 = 1.2815515655446004  # the standard normal's 0.9 quantile


@dataclass
class SimDevice:
    base_ms: dict[int, float]
    seed: int = 0
    ambient_c: float = 30.0
    hot_c: float = 70.0
    tau_heat_s: float = 20.0
    tau_cool_s: float = 30.0
    slow_per_c: float = 0.01
    sigma: float = 0.05
    hog: tuple[float, float, float] | None = None  # (from s, until s, slowdown) of a background task
    t: float = 0.0
    temp_c: float = field(init=False)
    reads_fail_after_s: float | None = None  # the sensor is gone from then on

    def __post_init__(self) -> None:
        self.temp_c, self.rng = self.ambient_c, random.Random(self.seed)

    def clock(self) -> float:
        return self.t

    def _advance(self, seconds: float, busy: bool) -> None:
        target, tau = (self.hot_c, self.tau_heat_s) if busy else (self.ambient_c, self.tau_cool_s)
        self.temp_c = target + (self.temp_c - target) * math.exp(-seconds / tau)
        self.t += seconds

    def slowdown(self) -> float:
        hogged = self.hog is not None and self.hog[0] <= self.t < self.hog[1]
        return (1 + self.slow_per_c * max(0.0, self.temp_c - self.ambient_c)) * (self.hog[2] if hogged else 1.0)

    def step(self, heads: int) -> None:
        self._advance(self.base_ms[heads] / 1e3 * self.slowdown() * math.exp(self.rng.gauss(0, self.sigma)), True)

    def sleep(self, seconds: float) -> None:
        self._advance(seconds, False)

    def state(self) -> dict[str, Any]:
        if self.reads_fail_after_s is not None and self.t >= self.reads_fail_after_s:
            return {"max_temp_c": None, "errors": {"thermal": "no such file"}}
        return {"max_temp_c": self.temp_c}

    def true_p90_ms(self, heads: int) -> float:
        """The p90 of a cool, unhurried device: what a calibration should report."""
        return self.base_ms[heads] * math.exp(Z90 * self.sigma)
