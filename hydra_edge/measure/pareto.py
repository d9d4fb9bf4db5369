"""The accuracy/latency Pareto front of a device's calibrated head counts.

One definition for the calibration plot (which marks the front) and the lookup table (which
chooses only among it): a head count is worth switching to only if no other is both at least as
fast and at least as accurate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One calibrated head count: what the Pareto front and the table's cells are chosen from."""

    heads: int
    artefact: str
    latency_ms: float
    accuracy: float  # top-1 %, or the head count where the bundle has no labelled accuracy
    power_w: float | None  # measured draw while it ran, where the device reports it
    # What a cell's budget is checked against: the upper end of the p90's 95 % interval (a calibration by
    # rounds); None for a record without one, which plans on latency_ms as before
    plan_ms: float | None = None

    @property
    def planned_ms(self) -> float:
        return self.latency_ms if self.plan_ms is None else self.plan_ms


def pareto(points: list[Point]) -> tuple[list[Point], list[Point]]:
    """(front fastest first, dominated): a point stays if it is more accurate than every faster one."""
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.latency_ms, -p.accuracy)):
        if not front or p.accuracy > front[-1].accuracy:
            front.append(p)
    return front, [p for p in points if p not in front]
