"""The lookup-table policy: battery bands, thermal states, budget, margins, dwell; a TOML file.

Every key has a default, so ``hydra-edge lut`` works without a policy file; a file overrides
only what it names. An example with every key and its default::

    budget_ms = 80.0            # or --budget-ms; the latency one inference may take on mains power
    min_dwell_s = 5.0           # no switch up sooner than this after the last switch

    [thermal]
    source = "auto"             # "temperature" (°C), "android" (thermal status), "auto": from the target
    edges_c = [60.0, 70.0, 80.0]             # temperature bands: <60, 60-70, 70-80, >=80 °C
    margin_c = 3.0                           # cool this far below an edge before switching up
    derating = [1.0, 1.15, 1.4, 2.0]         # per band, used when the calibration has no --soak
    throttled_c = 80.0                       # a throttled Raspberry Pi counts as this hot
    android_derating = [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0]   # NONE .. SHUTDOWN, without --soak

    [battery]
    margin_pct = 5.0            # recharge this far above a band edge before switching up
    charging_budget_scale = 1.0 # charging, or no battery (boards on mains)
    bands = [                   # discharging, highest first; the last must start at 0 %
      { min_pct = 50.0, budget_scale = 1.0 },
      { min_pct = 20.0, budget_scale = 0.75 },
      { min_pct = 0.0,  budget_scale = 0.5 },   # optional: max_energy_mj = 200.0
    ]

The default deratings are guesses that lean cautious, not measurements: a phone at SEVERE or a
Pi at 80 °C commonly runs a CPU-bound model 1.5-2x slower. ``hydra-edge calibrate --soak``
replaces them with what the device measured. Battery bands scale the latency budget (latency is
the energy proxy); where the calibration recorded power, ``max_energy_mj`` caps the energy of
one inference as well.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..atomic import read_json
from ..errors import HydraEdgeError
from ..runtime.lut import THERMAL_SOURCES
from ..runtime.signals.android import THERMAL_STATUS_NAMES as ANDROID_STATUSES


@dataclass(frozen=True)
class BatteryBand:
    min_pct: float
    budget_scale: float
    max_energy_mj: float | None = None


@dataclass(frozen=True)
class ThermalPolicy:
    source: str = "auto"
    edges_c: tuple[float, ...] = (60.0, 70.0, 80.0)
    margin_c: float = 3.0
    derating: tuple[float, ...] = (1.0, 1.15, 1.4, 2.0)
    throttled_c: float | None = 80.0
    android_derating: tuple[float, ...] = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class BatteryPolicy:
    margin_pct: float = 5.0
    charging_budget_scale: float = 1.0
    bands: tuple[BatteryBand, ...] = (BatteryBand(50.0, 1.0), BatteryBand(20.0, 0.75), BatteryBand(0.0, 0.5))


@dataclass(frozen=True)
class Policy:
    budget_ms: float | None = None  # no sensible default: it is the application's requirement
    min_dwell_s: float = 5.0  # several poll periods: a switch costs a model load without prefetch
    thermal: ThermalPolicy = field(default_factory=ThermalPolicy)
    battery: BatteryPolicy = field(default_factory=BatteryPolicy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _section(cls: type, d: Any, where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise HydraEdgeError(f"{where} must be a table")
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    if unknown:
        raise HydraEdgeError(f"{where}: unknown keys {unknown}; allowed: {sorted(f.name for f in fields(cls))}")
    return dict(d)


def _numbers(values: Any, where: str) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise HydraEdgeError(f"{where} must be a list of numbers")
    return tuple(float(v) for v in values)


# Keys that hold one number: checked finite here, since the C and Kotlin emitters print them as literals.
_SCALARS = {"budget_ms", "min_dwell_s", "margin_c", "throttled_c", "margin_pct", "charging_budget_scale",
            "min_pct", "budget_scale", "max_energy_mj"}


def _finite(section: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in section.items():
        if key in _SCALARS and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise HydraEdgeError(f"{where}: {key} must be a finite number, not {value!r}")
    return section


def policy_from_dict(d: dict[str, Any], where: str = "policy") -> Policy:
    """Build and check a policy; every problem is one line naming the key."""
    top = _finite(_section(Policy, d, where), where)
    thermal = _finite(_section(ThermalPolicy, top.pop("thermal", {}), f"{where} [thermal]"), f"{where} thermal")
    battery = _finite(_section(BatteryPolicy, top.pop("battery", {}), f"{where} [battery]"), f"{where} battery")
    for key in ("edges_c", "derating", "android_derating"):
        if key in thermal:
            thermal[key] = _numbers(thermal[key], f"{where} thermal.{key}")
    if "bands" in battery:
        if not isinstance(battery["bands"], list):
            raise HydraEdgeError(f"{where} battery.bands must be a list of tables")
        battery["bands"] = tuple(
            BatteryBand(**_finite(_section(BatteryBand, b, f"{where} battery.bands[{i}]"), f"{where} battery.bands[{i}]"))
            for i, b in enumerate(battery["bands"]))
    try:
        policy = Policy(**top, thermal=ThermalPolicy(**thermal), battery=BatteryPolicy(**battery))
    except TypeError as e:
        raise HydraEdgeError(f"{where}: {e}") from None
    check(policy, where)
    return policy


def check(p: Policy, where: str = "policy") -> None:
    t, b = p.thermal, p.battery
    if t.source not in ("auto", *THERMAL_SOURCES):
        raise HydraEdgeError(f"{where}: thermal.source {t.source!r}; choose auto, {', '.join(THERMAL_SOURCES)}")
    if not t.edges_c or list(t.edges_c) != sorted(set(t.edges_c)):
        raise HydraEdgeError(f"{where}: thermal.edges_c must be one or more strictly rising °C, e.g. [60, 70, 80]")
    if len(t.derating) != len(t.edges_c) + 1:
        raise HydraEdgeError(f"{where}: thermal.derating needs one multiplier per band ({len(t.edges_c) + 1})")
    if len(t.android_derating) != len(ANDROID_STATUSES):
        raise HydraEdgeError(f"{where}: thermal.android_derating needs {len(ANDROID_STATUSES)} multipliers (NONE..SHUTDOWN)")
    if any(m < 1.0 for m in (*t.derating, *t.android_derating)):
        raise HydraEdgeError(f"{where}: a derating below 1.0 would plan for a hot device being faster")
    mins = [band.min_pct for band in b.bands]
    if not mins or mins != sorted(set(mins), reverse=True) or mins[-1] != 0:
        raise HydraEdgeError(f"{where}: battery.bands must fall strictly by min_pct and end at min_pct = 0")
    if any(s <= 0 for s in (b.charging_budget_scale, *(band.budget_scale for band in b.bands))):
        raise HydraEdgeError(f"{where}: budget_scale must be positive")
    if min(t.margin_c, b.margin_pct, p.min_dwell_s) < 0:
        raise HydraEdgeError(f"{where}: margins and min_dwell_s cannot be negative")
    if p.budget_ms is not None and not p.budget_ms > 0:
        raise HydraEdgeError(f"{where}: budget_ms must be positive")


def load_policy(path: str | Path | None) -> Policy:
    """The defaults, overridden by ``path`` when given."""
    if path is None:
        return Policy()
    d = read_json(path, "policy", "write one (see hydra_edge/lut/policy.py) or leave out --policy",
                  loads=tomllib.loads)
    return policy_from_dict(d, str(path))
