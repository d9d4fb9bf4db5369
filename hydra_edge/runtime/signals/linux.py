"""Linux board signals: sysfs thermal zones and power supplies, Raspberry Pi ``vcgencmd``,
Jetson ``tegrastats``.

Every path is taken under a ``root`` (default ``/``) so tests, and a host reading a mounted
board image, can point elsewhere. Units follow the kernel ABI (Documentation/ABI/testing/
sysfs-class-thermal and sysfs-class-power): temperatures in m°C (power supply ``temp`` in
tenths of °C), power in µW, current in µA, voltage in µV.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ._text import EQUALS_TOKENS, NUMBER, integer, number, pairs, read_number, read_text

MILLI = 1e-3
MICRO = 1e-6
# What a working sensor can report; anything else is a broken driver or a misread file, not the board.
TEMPERATURE_RANGE_C = (-50.0, 150.0)
CAPACITY_RANGE_PCT = (0.0, 100.0)


def _index(path: Path) -> int:
    """The number in ``thermal_zone12`` / ``trip_point_3_temp``, so that 10 sorts after 9."""
    match = re.search(r"\d+", path.name)
    return int(match.group()) if match else -1


@dataclass(frozen=True)
class TripPoint:
    """A temperature at which the kernel acts (``passive`` throttles, ``critical`` shuts down)."""

    temp_c: float
    type: Optional[str]


@dataclass(frozen=True)
class ThermalZone:
    """One ``/sys/class/thermal/thermal_zoneN``; ``temp_c`` is None if the sensor will not read,
    and ``error`` then says why (unreadable, not a number, out of range)."""

    zone: str
    name: str
    temp_c: Optional[float]
    trip_points: Tuple[TripPoint, ...] = ()
    error: Optional[str] = None


def under(root: str, path: str) -> Path:
    """A device path (``/sys/...``) as seen under ``root``."""
    return Path(root, path.lstrip("/"))


def read_thermal_zones(root: str = "/", names: Optional[Iterable[str]] = None) -> List[ThermalZone]:
    """The thermal zones under ``root`` in index order; an empty list where there are none.

    ``names`` keeps only the zones of those types, and only those are read: a sensor the profile
    leaves out may be one whose driver stalls or fails on read.
    """
    paths = sorted(under(root, "sys/class/thermal").glob("thermal_zone*"), key=_index)
    if names is not None:
        keep = set(names)
        paths = [path for path in paths if _zone_name(path) in keep]
    return [_read_zone(path / "temp") for path in paths]


def read_temperature_files(files: Mapping[str, str], root: str = "/") -> List[ThermalZone]:
    """The temperature files a profile names (``{key: path}``, m°C), each read as one sensor.

    A file that is a thermal zone's ``temp`` is named by the zone's type, with its trip points;
    any other file (a hwmon ``temp1_input``, a file a vendor tool keeps up to date) by its key
    without the unit (``board_mC``: ``board``).
    """
    return [_read_zone(under(root, path), key[:-3] if key.endswith("_mC") else key) for key, path in files.items()]


def _zone_name(path: Path, fallback: Optional[str] = None) -> str:
    return read_text(path / "type") or fallback or path.name


def _read_zone(temp_file: Path, key: Optional[str] = None) -> ThermalZone:
    path = temp_file.parent
    trips = []
    for trip_file in sorted(path.glob("trip_point_*_temp"), key=_index):
        temp_c = number(read_text(trip_file), MILLI)
        if temp_c is not None:
            trip_type = read_text(trip_file.with_name(trip_file.name.replace("_temp", "_type")))
            trips.append(TripPoint(temp_c, trip_type))
    temp_c, error = read_number(temp_file, MILLI, TEMPERATURE_RANGE_C, "°C")
    return ThermalZone(
        zone=path.name if key is None or path.name.startswith("thermal_zone") else key,
        name=_zone_name(path, key),
        temp_c=temp_c,
        trip_points=tuple(trips),
        error=error,
    )


@dataclass(frozen=True)
class PowerSupply:
    """One ``/sys/class/power_supply/<name>``: a battery, or a Mains/USB input.

    ``capacity`` is None when it will not read or is not a percentage; ``capacity_error`` says why.
    """

    name: str
    type: Optional[str]
    status: Optional[str]
    capacity: Optional[int]
    online: Optional[bool]
    power_w: Optional[float]
    temp_c: Optional[float]
    capacity_error: Optional[str] = None

    @property
    def charging(self) -> Optional[bool]:
        return None if self.status is None else self.status == "Charging"


def read_power_supplies(root: str = "/") -> List[PowerSupply]:
    """Every power supply under ``root``, sorted by name; an empty list where there are none."""
    return [read_power_supply(path) for path in sorted(under(root, "sys/class/power_supply").glob("*"))]


def read_power_supply(path: Path) -> PowerSupply:
    """One power supply folder (``/sys/class/power_supply/<name>``, or one a profile names)."""
    online = integer(read_text(path / "online"))
    capacity, capacity_error = read_number(path / "capacity", 1.0, CAPACITY_RANGE_PCT, "%")
    return PowerSupply(
        name=path.name,
        type=read_text(path / "type"),
        status=read_text(path / "status"),
        capacity=None if capacity is None else round(capacity),
        online=None if online is None else online == 1,
        power_w=_supply_power_w(path),
        temp_c=number(read_text(path / "temp"), 0.1),
        capacity_error=capacity_error,
    )


def _supply_power_w(path: Path) -> Optional[float]:
    """``power_now`` when the driver has it, else ``current_now * voltage_now``.

    Absolute values: the sign of ``current_now`` means charge or discharge depending on the
    driver, and the switcher only wants the magnitude.
    """
    power = number(read_text(path / "power_now"), MICRO)
    if power is not None:
        return abs(power)
    current = number(read_text(path / "current_now"), MICRO)
    voltage = number(read_text(path / "voltage_now"), MICRO)
    return None if current is None or voltage is None else abs(current * voltage)


def parse_measure_temp(text: Optional[str]) -> Optional[float]:
    """°C from ``vcgencmd measure_temp`` (``temp=48.3'C``)."""
    return number(pairs(EQUALS_TOKENS, text).get("temp"))


# get_throttled bit i is the condition now; bit i + 16 says it has happened since boot.
THROTTLE_FLAGS = ("under_voltage", "arm_freq_capped", "throttled", "soft_temp_limit")
_SINCE_BOOT_SHIFT = 16


@dataclass(frozen=True)
class Throttling:
    """The decoded ``vcgencmd get_throttled`` word; ``raw`` keeps the bits not named here."""

    raw: int
    under_voltage: bool
    arm_freq_capped: bool
    throttled: bool
    soft_temp_limit: bool
    under_voltage_occurred: bool
    arm_freq_capped_occurred: bool
    throttled_occurred: bool
    soft_temp_limit_occurred: bool

    @classmethod
    def from_raw(cls, raw: int) -> "Throttling":
        flags = {}
        for bit, name in enumerate(THROTTLE_FLAGS):
            flags[name] = bool(raw >> bit & 1)
            flags[f"{name}_occurred"] = bool(raw >> (bit + _SINCE_BOOT_SHIFT) & 1)
        return cls(raw=raw, **flags)

    @property
    def any_now(self) -> bool:
        """True if any limit is active right now: the latency being measured is not the board's."""
        return any(getattr(self, name) for name in THROTTLE_FLAGS)


def parse_get_throttled(text: Optional[str]) -> Optional[Throttling]:
    """Decode ``vcgencmd get_throttled`` (``throttled=0x50000``)."""
    raw = integer(pairs(EQUALS_TOKENS, text).get("throttled"))
    return None if raw is None else Throttling.from_raw(raw)


# tegrastats names its sensors and rails per module, so these patterns are generic:
# ``cpu@54.9C`` / ``CPU@27.5C``, and ``VDD_IN 4673mW/4673mW`` (Orin, Xavier) or
# ``POM_5V_IN 1004/1004`` (Nano: mW without the unit). The lookahead keeps ``RAM 2272/7620MB`` out.
_TEGRA_MEMORY = re.compile(r"\b(RAM|SWAP) (\d+)/(\d+)MB")
_TEGRA_TEMP = re.compile(rf"(\w+)@({NUMBER})C\b")
_TEGRA_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
_TEGRA_SENSOR_OFF = -256.0  # what tegrastats prints for a powered-down sensor (cv0@-256C)
# The rail that feeds the whole module, where the module has one (AGX Orin has none: its rails
# are per domain, and their sum is not the board's draw).
_TEGRA_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass(frozen=True)
class TegraStats:
    """One ``tegrastats`` sample: memory in MB, sensors in °C, rails now and averaged in mW."""

    ram_used_mb: Optional[int]
    ram_total_mb: Optional[int]
    swap_used_mb: Optional[int]
    swap_total_mb: Optional[int]
    temps_c: Dict[str, float]
    power_mw: Dict[str, float]
    power_avg_mw: Dict[str, float]

    def input_power_w(self) -> Optional[float]:
        """The module's input power in W, or None where tegrastats has no whole-module rail."""
        rail = next((name for name in _TEGRA_INPUT_RAILS if name in self.power_mw), None)
        return None if rail is None else self.power_mw[rail] * MILLI


def parse_tegrastats(text: Optional[str]) -> Optional[TegraStats]:
    """Parse the last non-empty line of ``tegrastats`` output (the newest sample)."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    memory = {kind: (int(used), int(total)) for kind, used, total in _TEGRA_MEMORY.findall(line)}
    temps = {name: float(value) for name, value in _TEGRA_TEMP.findall(line)}
    rails = _TEGRA_RAIL.findall(line)
    if not (memory or temps or rails):
        return None
    ram, swap = memory.get("RAM", (None, None)), memory.get("SWAP", (None, None))
    return TegraStats(
        ram_used_mb=ram[0],
        ram_total_mb=ram[1],
        swap_used_mb=swap[0],
        swap_total_mb=swap[1],
        temps_c={name: value for name, value in temps.items() if value > _TEGRA_SENSOR_OFF},
        power_mw={name: float(now) for name, now, _ in rails},
        power_avg_mw={name: float(avg) for name, _, avg in rails},
    )
