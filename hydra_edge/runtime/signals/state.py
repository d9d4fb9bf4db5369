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
text to the same parsers. A missing file or command gives None fields, never an exception; a
signal the profile names that gives no usable value (missing, unreadable, garbage, absurd) also
gets a line in ``DeviceState.errors``, so the switcher can tell "no battery" from "battery
unreadable".
"""

import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ...errors import HydraEdgeError
from ._text import range_error
from .android import parse_battery, parse_thermalservice, thermal_status_name
from .linux import (CAPACITY_RANGE_PCT, TEMPERATURE_RANGE_C, TegraStats, ThermalZone, Throttling,
                    parse_get_throttled, parse_measure_temp, parse_tegrastats, read_power_supplies,
                    read_thermal_zones)

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

    ``thermal_zones`` maps a sensor name to °C; ``battery_capacity`` is in % (0-100);
    ``charging`` is true only while the battery status is Charging; ``power_w`` is measured
    draw, when the battery or a Jetson input rail reports it. ``errors`` maps a signal the
    profile names (``thermal``, ``battery``, ``tegrastats``) to why it gave no
    usable reading; a signal that is not named is simply absent.
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
    errors: Dict[str, str] = field(default_factory=dict)

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


def _zone_errors(zones: Iterable[ThermalZone]) -> Dict[str, str]:
    """{zone name: why it gave no temperature} for zones that do not read."""
    return {zone.name: f"{zone.zone}: {zone.error}" for zone in zones if zone.error is not None}


# One function per (signal, value) of the [signals] table. Each returns DeviceState fields, plus
# "error" (why the signal gave nothing usable) and "zone_errors" ({sensor: why it did not read}).
def _sysfs_thermal(root: str, run: Runner) -> Dict[str, Any]:
    zones = read_thermal_zones(root)
    if not zones:
        return {"error": f"no thermal zone under {root.rstrip('/')}/sys/class/thermal"}
    return {"thermal_zones": zone_temperatures(zones), "zone_errors": _zone_errors(zones)}


def _sysfs_battery(root: str, run: Runner) -> Dict[str, Any]:
    # Batteries first: their draw is the board's; a Mains/USB supply that measures is the fallback.
    supplies = sorted(read_power_supplies(root), key=lambda supply: supply.type != "Battery")
    battery = next((s for s in supplies if s.type == "Battery"), None)
    measured = [supply.power_w for supply in supplies if supply.power_w is not None]
    found: Dict[str, Any] = {"power_w": measured[0] if measured else None}
    if battery is None:
        found["error"] = f"no battery under {root.rstrip('/')}/sys/class/power_supply"
    else:
        found.update(battery_capacity=battery.capacity, battery_status=battery.status,
                     charging=battery.charging, battery_temp_c=battery.temp_c,
                     error=battery.capacity_error and f"{battery.name} capacity: {battery.capacity_error}")
    return found


def _no_output(argv: Sequence[str]) -> str:
    return f"`{' '.join(argv)}` failed or printed nothing"


def _dumpsys_thermal(root: str, run: Runner) -> Dict[str, Any]:
    text = run(COMMANDS["thermalservice"])
    thermal = parse_thermalservice(text)
    if thermal is None:
        return {"error": _no_output(COMMANDS["thermalservice"]) if not text else
                "dumpsys thermalservice has neither a status nor a temperature"}
    return {"thermal_zones": thermal.temperatures_c, "android_thermal_status": thermal.status,
            "error": None if thermal.status is not None else "dumpsys thermalservice has no Thermal Status"}


def _dumpsys_battery(root: str, run: Runner) -> Dict[str, Any]:
    text = run(COMMANDS["battery"])
    battery = parse_battery(text)
    if battery is None:
        return {"error": _no_output(COMMANDS["battery"]) if not text else "dumpsys battery has no level"}
    error = range_error(battery.level, CAPACITY_RANGE_PCT, "%") if battery.level is not None else None
    return {"battery_capacity": None if error else battery.level, "battery_status": battery.status,
            "charging": battery.charging, "battery_temp_c": battery.temperature_c,
            "error": error and f"dumpsys battery level: {error}"}


def _vcgencmd(root: str, run: Runner) -> Dict[str, Any]:
    text = run(COMMANDS["measure_temp"])
    temp = parse_measure_temp(text)
    error = _no_output(COMMANDS["measure_temp"]) if not text else \
        f"vcgencmd measure_temp printed {text.strip()[:40]!r}" if temp is None else \
        range_error(temp, TEMPERATURE_RANGE_C, "°C")
    return {"thermal_zones": {} if error else {"vcgencmd": temp},
            "zone_errors": {"vcgencmd": error} if error else {},
            "throttling": parse_get_throttled(run(COMMANDS["get_throttled"]))}


def _tegrastats(root: str, run: Runner) -> Dict[str, Any]:
    stats = parse_tegrastats(run(COMMANDS["tegrastats"]))
    if stats is None:
        return {"error": _no_output(COMMANDS["tegrastats"])}
    return {"tegrastats": stats, "power_w": stats.input_power_w()}


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
# The signals that give a temperature (thermal zones or the Android thermal status).
THERMAL_SIGNALS = ("thermal", "vcgencmd")


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


def configured(profile_signals: Mapping[str, Any]) -> Dict[str, Any]:
    """The signals ``read_state`` reads for this table, flat (``{"thermal": "sysfs", ...}``).

    A signal switched off (``battery = "none"``, false) or never named is absent: for the battery
    that means a board on mains, while a named battery that cannot be read is an error, not mains.
    """
    flat = {**signals_from_profile(profile_signals), **profile_signals}
    return {signal: value for signal, value in flat.items() if signal in SIGNALS and value not in _OFF}


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
    a known key with an unknown value is a profile error and raises ``HydraEdgeError``. Anything
    else that goes wrong while reading (a file that will not open, a reader that raises) becomes
    a line in ``errors``, never an exception.
    """
    timestamp = time.time()
    zones: Dict[str, float] = {}
    unread: Dict[str, str] = {}
    errors: Dict[str, str] = {}
    found: Dict[str, Any] = {}
    for signal, value in configured(profile_signals).items():
        source = _source(signal, value)
        try:
            readings = source(root, run)
        except Exception as e:  # noqa: BLE001 - a reader must never stop the switcher
            readings = {"error": f"{type(e).__name__}: {e}"}
        zones.update(readings.pop("thermal_zones", {}))
        unread.update(readings.pop("zone_errors", {}))
        error = readings.pop("error", None)
        if error:
            errors[signal] = error
        found.update({key: reading for key, reading in readings.items() if reading is not None})
    keep = profile_signals.get("thermal_zones")
    if keep:
        zones = {name: temp for name, temp in zones.items() if name in keep}
        unread = {name: error for name, error in unread.items() if name in keep}
    if unread and not zones:  # no sensor gives a temperature: say why the first one did not
        more = f" (and {len(unread) - 1} more sensors)" if len(unread) > 1 else ""
        errors.setdefault("thermal", next(iter(unread.values())) + more)
    return DeviceState(timestamp=timestamp, thermal_zones=zones, errors=errors, **found)
