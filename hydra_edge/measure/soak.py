"""Sustained load (``--soak``): from timed samples under heat to a latency derating curve.

A device that is cool when calibrated slows down once it has run for minutes: it heats up,
the kernel (or Android's thermal service) lowers clocks. The lookup table plans with the cool
latency times the multiplier for the state the device reports, so the tables here are all
relative to the coolest, unthrottled samples.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any, Iterable, Sequence

from ..bounds import MAX_SOAK_S
from ..errors import HydraEdgeError
from ..records.calibration import Derating
from ..runtime.signals import THERMAL_STATUS_NAMES

TEMP_BIN_C = 5.0  # wide enough for several samples per bin, narrow enough to see a throttle step
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")


def parse_duration(text: str) -> float:
    """``10m``, ``30s``, ``1h``, ``90`` (seconds) or ``1m30s`` -> seconds."""
    compact = re.sub(r"\s+", "", text.lower())
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?[hms]?)+", compact):
        raise HydraEdgeError(f"cannot read the duration {text!r}; write e.g. 10m, 30s, 1h or 1m30s")
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))
    if seconds <= 0:
        raise HydraEdgeError(f"the duration {text!r} must be longer than zero")
    if seconds > MAX_SOAK_S:
        raise HydraEdgeError(f"--soak {text} is longer than a soak may run ({MAX_SOAK_S / 3600:g}h); "
                             "a device heats to its steady state in minutes, give e.g. 10m")
    return seconds


def _relative(groups: dict[Any, list[float]], baseline: Any) -> dict[Any, float]:
    """Median latency of each group over the baseline group's median."""
    base = statistics.median(groups[baseline])
    return {key: statistics.median(values) / base for key, values in groups.items()}


def _grouped(samples: Iterable[dict[str, Any]], key: str) -> dict[Any, list[float]]:
    groups: dict[Any, list[float]] = {}
    for sample in samples:
        if sample.get(key) is not None and sample.get("latency_ms"):
            groups.setdefault(sample[key], []).append(sample["latency_ms"])
    return groups


def by_temperature(samples: Sequence[dict[str, Any]], bin_c: float = TEMP_BIN_C) -> list[tuple[float, float]]:
    """(lower bound of each ``bin_c`` °C bin, median latency there / in the coolest bin), ascending."""
    binned = [{**s, "bin": math.floor(s["max_temp_c"] / bin_c) * bin_c}
              for s in samples if s.get("max_temp_c") is not None]
    groups = _grouped(binned, "bin")
    if not groups:
        return []
    return sorted((float(low), multiplier) for low, multiplier in _relative(groups, min(groups)).items())


def by_thermal_status(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Android status name -> multiplier against the mildest status seen (NONE on a cool phone)."""
    groups = _grouped(samples, "android_thermal_status")
    if not groups:
        return {}
    mildest = min(groups, key=lambda name: THERMAL_STATUS_NAMES.index(name) if name in THERMAL_STATUS_NAMES else 99)
    return {str(name): m for name, m in _relative(groups, mildest).items()}


def by_throttled(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``"false"``/``"true"`` -> multiplier against unthrottled; empty without unthrottled samples."""
    groups = {str(flag).lower(): values for flag, values in _grouped(samples, "throttled").items()}
    return _relative(groups, "false") if "false" in groups else {}


def derate(heads: int, duration_s: float, samples: list[dict[str, Any]]) -> Derating:
    """The derating record of one soak: raw samples plus the three tables the lookup table reads."""
    if not samples:
        raise HydraEdgeError("the soak produced no samples; give it a longer --soak")
    return Derating(heads=heads, duration_s=duration_s, samples=samples, by_temperature=by_temperature(samples),
                    by_thermal_status=by_thermal_status(samples), by_throttled=by_throttled(samples),
                    bin_c=TEMP_BIN_C)
