"""The lookup-table policy record (a TOML file; every key has a default, documented in ``hydra_edge.lut.policy``).

Besides each field's type and range, the checks that tie fields together live here too: one
derating per thermal band, bands that rise or fall strictly, battery bands that end at 0 %.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Tuple

import msgspec
from msgspec import Meta

from .fields import ANDROID_THERMAL_STATUSES as ANDROID_STATUSES, Percent, PosFloat

Celsius = Annotated[float, Meta(ge=-273.15, le=1000.0)]
Multiplier = Annotated[float, Meta(ge=1.0, le=1000.0)]  # below 1.0 would plan for a hot device being faster
Margin = Annotated[float, Meta(ge=0.0, le=1000.0)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e6)]


class BatteryBand(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    min_pct: Percent
    budget_scale: PosFloat
    max_energy_mj: Optional[PosFloat] = None


class ThermalPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: Literal["auto", "temperature", "android"] = "auto"
    edges_c: Annotated[Tuple[Celsius, ...], Meta(min_length=1, max_length=64)] = (60.0, 70.0, 80.0)
    margin_c: Margin = 3.0
    derating: Tuple[Multiplier, ...] = (1.0, 1.15, 1.4, 2.0)
    throttled_c: Optional[Celsius] = 80.0
    android_derating: Tuple[Multiplier, ...] = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)

    def __post_init__(self) -> None:
        if list(self.edges_c) != sorted(set(self.edges_c)):
            raise ValueError("`.edges_c`: must be one or more strictly rising °C, e.g. [60, 70, 80]")
        if len(self.derating) != len(self.edges_c) + 1:
            raise ValueError(f"`.derating`: needs one multiplier per band ({len(self.edges_c) + 1})")
        if len(self.android_derating) != len(ANDROID_STATUSES):
            raise ValueError(f"`.android_derating`: needs {len(ANDROID_STATUSES)} multipliers (NONE..SHUTDOWN)")


class BatteryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    margin_pct: Annotated[float, Meta(ge=0.0, le=100.0)] = 5.0
    charging_budget_scale: PosFloat = 1.0
    bands: Annotated[Tuple[BatteryBand, ...], Meta(min_length=1, max_length=100)] = (
        BatteryBand(50.0, 1.0), BatteryBand(20.0, 0.75), BatteryBand(0.0, 0.5))

    def __post_init__(self) -> None:
        mins = [band.min_pct for band in self.bands]
        if mins != sorted(set(mins), reverse=True) or mins[-1] != 0:
            raise ValueError("`.bands`: must fall strictly by min_pct and end at min_pct = 0")


class Policy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    budget_ms: Optional[PosFloat] = None  # no sensible default: it is the application's requirement
    min_dwell_s: Seconds = 5.0  # several poll periods: a switch costs a model load without prefetch
    thermal: ThermalPolicy = msgspec.field(default_factory=ThermalPolicy)
    battery: BatteryPolicy = msgspec.field(default_factory=BatteryPolicy)

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)
