"""``DeviceState``: one timestamped reading of temperature, battery, power and throttling.

``read_state`` collects what a target profile's ``[signals]`` table names, either flat::

    [signals]
    thermal = "sysfs"        # or "dumpsys" (Android thermalservice)
    battery = "sysfs"        # or "dumpsys" (Android battery)
    vcgencmd = true          # Raspberry Pi: SoC temperature and throttling bits
    tegrastats = true        # Jetson: sensors, rails, RAM
    thermal_zones = ["cpu-thermal", "gpu-thermal"]   # optional: keep only these sensors

or as targets/*.toml write it, ``[signals.files]`` and ``[signals.commands]``, from which
``signals_from_profile`` derives the flat keys (a flat key given beside them wins).

Commands go through an injectable runner, so a host can run ``dumpsys`` over adb and hand the
text to the same parsers. A missing file or command gives None fields, never an exception.
"""

import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ...errors import HydraEdgeError
from .android import parse_battery, parse_thermalservice, thermal_status_name
from .linux import (TegraStats, ThermalZone, Throttling, parse_get_throttled, parse_measure_temp,
                    parse_tegrastats, read_power_supplies, read_thermal_zones)

# Takes argv, returns stdout, or None when the command is missing, fails or times out.
Runner = Callable[[Sequence[str]], Optional[str]]

# What each command-based signal runs on the device. tegrastats never exits on its own, so
# ``head`` takes one sample and the pipe closes it.
COMMANDS: Dict[str, Sequence[str]] = {
    "measure_temp": ("vcgencmd", "measure_temp"),
    "get_throttled": ("vcgencmd", "get_throttled"),
    "tegrastats": ("sh", "-c", "tegrastats --interval 100 | head -n 1"),
    "thermalservice": ("dumpsys", "thermalservice"),
    "battery": ("dumpsys", "battery"),
}


def run_command(argv: Sequence[str], timeout_s: float = 10.0) -> Optional[str]:
    """Run ``argv`` locally; its stdout, or None if it is missing, fails or outlives the timeout."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class DeviceState:
    """What the device reports at ``timestamp`` (Unix seconds); None where it cannot tell.

    ``thermal_zones`` maps a sensor name to °C; ``battery_capacity`` is in %; ``charging`` is
    true only while the battery status is Charging; ``power_w`` is measured draw, when the
    battery or a Jetson input rail reports it.
    """

    timestamp: float
    thermal_zones: Dict[str, float] = field(default_factory=dict)
    battery_capacity: Optional[int] = None
    battery_status: Optional[str] = None
    charging: Optional[bool] = None
    battery_temp_c: Optional[float] = None
    power_w: Optional[float] = None
    throttling: Optional[Throttling] = None
    android_thermal_status: Optional[int] = None
    tegrastats: Optional[TegraStats] = None

    @property
    def max_temp_c(self) -> Optional[float]:
        return max(self.thermal_zones.values(), default=None)

    @property
    def android_thermal_status_name(self) -> Optional[str]:
        return thermal_status_name(self.android_thermal_status)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict; the derived ``max_temp_c`` and status name are included for logs."""
        data = asdict(self)
        data.update(max_temp_c=self.max_temp_c,
                    android_thermal_status_name=self.android_thermal_status_name)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceState":
        """Rebuild from ``to_dict`` output; derived and unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if values.get("throttling") is not None:
            values["throttling"] = Throttling(**values["throttling"])
        if values.get("tegrastats") is not None:
            values["tegrastats"] = TegraStats(**values["tegrastats"])
        return cls(**values)


def zone_temperatures(zones: Iterable[ThermalZone]) -> Dict[str, float]:
    """{zone name: °C} for zones that read; a repeated name gets its directory appended."""
    temps: Dict[str, float] = {}
    for zone in zones:
        if zone.temp_c is not None:
            key = zone.name if zone.name not in temps else f"{zone.name}/{zone.zone}"
            temps[key] = zone.temp_c
    return temps


# One function per (signal, value) of the [signals] table. Each returns DeviceState fields.
def _sysfs_thermal(root: str, run: Runner) -> Dict[str, Any]:
    return {"thermal_zones": zone_temperatures(read_thermal_zones(root))}


def _sysfs_battery(root: str, run: Runner) -> Dict[str, Any]:
    # Batteries first: their draw is the board's; a Mains/USB supply that measures is the fallback.
    supplies = sorted(read_power_supplies(root), key=lambda supply: supply.type != "Battery")
    battery = next((s for s in supplies if s.type == "Battery"), None)
    measured = [supply.power_w for supply in supplies if supply.power_w is not None]
    found: Dict[str, Any] = {"power_w": measured[0] if measured else None}
    if battery is not None:
        found.update(battery_capacity=battery.capacity, battery_status=battery.status,
                     charging=battery.charging,
                     battery_temp_c=battery.temp_c)
    return found


def _dumpsys_thermal(root: str, run: Runner) -> Dict[str, Any]:
    thermal = parse_thermalservice(run(COMMANDS["thermalservice"]))
    if thermal is None:
        return {}
    return {"thermal_zones": thermal.temperatures_c, "android_thermal_status": thermal.status}


def _dumpsys_battery(root: str, run: Runner) -> Dict[str, Any]:
    battery = parse_battery(run(COMMANDS["battery"]))
    if battery is None:
        return {}
    return {"battery_capacity": battery.level, "battery_status": battery.status,
            "charging": battery.charging, "battery_temp_c": battery.temperature_c}


def _vcgencmd(root: str, run: Runner) -> Dict[str, Any]:
    temp = parse_measure_temp(run(COMMANDS["measure_temp"]))
    return {"thermal_zones": {} if temp is None else {"vcgencmd": temp},
            "throttling": parse_get_throttled(run(COMMANDS["get_throttled"]))}


def _tegrastats(root: str, run: Runner) -> Dict[str, Any]:
    stats = parse_tegrastats(run(COMMANDS["tegrastats"]))
    return {} if stats is None else {"tegrastats": stats, "power_w": stats.input_power_w()}


_SOURCES: Dict[Tuple[str, Any], Callable[[str, Runner], Dict[str, Any]]] = {
    ("thermal", "sysfs"): _sysfs_thermal,
    ("thermal", "dumpsys"): _dumpsys_thermal,
    ("battery", "sysfs"): _sysfs_battery,
    ("battery", "dumpsys"): _dumpsys_battery,
    ("vcgencmd", True): _vcgencmd,
    ("tegrastats", True): _tegrastats,
}
SIGNALS = tuple(dict.fromkeys(signal for signal, _ in _SOURCES))
_OFF = (False, None, "none")


# How targets/*.toml's [signals.commands] and [signals.files] map onto the flat keys: a command
# is known by the tool it starts, a file by the sysfs class it lies in.
_PROFILE_COMMANDS = (("vcgencmd", ("vcgencmd", True)), ("tegrastats", ("tegrastats", True)),
                     ("dumpsys thermalservice", ("thermal", "dumpsys")),
                     ("dumpsys battery", ("battery", "dumpsys")))
_PROFILE_FILES = (("/sys/class/thermal/", ("thermal", "sysfs")),
                  ("/sys/devices/virtual/thermal/", ("thermal", "sysfs")),
                  ("/sys/class/power_supply/", ("battery", "sysfs")))


def signals_from_profile(table: Mapping[str, Any]) -> Dict[str, Any]:
    """The flat ``read_state`` keys implied by a ``{"files": .., "commands": ..}`` signals table.

    A command outranks a file for the same signal: on a phone the host reaches the sysfs path
    only through adb, while dumpsys is what the framework itself acts on.
    """
    flat: Dict[str, Any] = {}
    for command in table.get("commands", {}).values():
        flat.update(found for prefix, found in _PROFILE_COMMANDS if command.startswith(prefix))
    for path in table.get("files", {}).values():
        for prefix, (signal, value) in _PROFILE_FILES:
            if path.startswith(prefix):
                flat.setdefault(signal, value)
    return flat


def _source(signal: str, value: Any) -> Callable[[str, Runner], Dict[str, Any]]:
    source = _SOURCES.get((signal, value)) if isinstance(value, (str, bool)) else None
    if source is None:
        choices = ", ".join(repr(v) for s, v in _SOURCES if s == signal)
        raise HydraEdgeError(f"[signals] {signal} = {value!r} is not supported; use {choices} "
                             f"or false")
    return source


def read_state(profile_signals: Mapping[str, Any], root: str = "/",
               run: Runner = run_command) -> DeviceState:
    """Read what ``profile_signals`` names, in table order (a later signal's power wins).

    Keys other than ``SIGNALS``, ``thermal_zones``, ``files`` and ``commands`` are ignored;
    a known key with an unknown value is a profile error and raises ``HydraEdgeError``.
    """
    timestamp = time.time()
    profile_signals = {**signals_from_profile(profile_signals), **profile_signals}
    zones: Dict[str, float] = {}
    found: Dict[str, Any] = {}
    for signal, value in profile_signals.items():
        if signal not in SIGNALS or value in _OFF:
            continue
        readings = _source(signal, value)(root, run)
        zones.update(readings.pop("thermal_zones", {}))
        found.update({key: reading for key, reading in readings.items() if reading is not None})
    keep = profile_signals.get("thermal_zones")
    if keep:
        zones = {name: temp for name, temp in zones.items() if name in keep}
    return DeviceState(timestamp=timestamp, thermal_zones=zones, **found)
