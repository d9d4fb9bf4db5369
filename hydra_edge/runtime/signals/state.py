"""``DeviceState``: one timestamped reading of temperature, battery, power and throttling.

``read_state`` collects what a target profile's ``[signals]`` table names, either flat::

    [signals]
    thermal = "sysfs"        # or "dumpsys" (Android thermalservice)
    headroom = "cmd"         # Android 14+: cmd thermalservice headroom 10, the thermal forecast
    battery = "sysfs"        # or "dumpsys" (Android battery)
    vcgencmd = true          # Raspberry Pi: SoC temperature and throttling bits
    tegrastats = true        # Jetson: sensors, rails, RAM
    thermal_zones = ["cpu-thermal", "gpu-thermal"]   # optional: keep only these sensors

or as targets/*.toml write it, ``[signals.files]`` and ``[signals.commands]``, from which
``signals_from_profile`` derives the flat keys (a flat key given beside them wins). What those
tables name is what is read: a file key ending in ``_mC`` (or a thermal zone's ``temp``) is
the temperature file read, instead of every zone; a file under ``/sys/class/power_supply/``
names the battery's folder; a command line that starts one of the tools in ``TOOLS`` is run as
written (``tegrastats --interval 500`` samples every 500 ms), instead of its default in
``COMMANDS``.

Commands go through an injectable runner, so a host can run ``dumpsys`` over adb and hand the
text to the same parsers. A missing file or command gives None fields, never an exception; a
signal the profile names that gives no usable value (missing, unreadable, garbage, absurd) also
gets a line in ``DeviceState.errors``, so the switcher can tell "no battery" from "battery
unreadable".
"""

import shlex
import subprocess
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ...errors import HydraEdgeError
from ._text import range_error
from .android import parse_battery, parse_headroom, parse_thermalservice, thermal_status_name
from .linux import (CAPACITY_RANGE_PCT, TEMPERATURE_RANGE_C, TegraStats, ThermalZone, Throttling,
                    parse_get_throttled, parse_measure_temp, parse_tegrastats, read_power_supplies,
                    read_power_supply, read_temperature_files, read_thermal_zones, under)

# Takes argv, returns stdout, or None when the command is missing, fails or times out.
Runner = Callable[[Sequence[str]], Optional[str]]

# The tools command-based signals run, known by program and subcommand, and the signal each serves.
TOOLS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, Any]]] = {
    "measure_temp": (("vcgencmd", "measure_temp"), ("vcgencmd", True)),
    "get_throttled": (("vcgencmd", "get_throttled"), ("vcgencmd", True)),
    "tegrastats": (("tegrastats",), ("tegrastats", True)),
    "thermalservice": (("dumpsys", "thermalservice"), ("thermal", "dumpsys")),
    "headroom": (("cmd", "thermalservice", "headroom"), ("headroom", "cmd")),
    "battery": (("dumpsys", "battery"), ("battery", "dumpsys")),
}
# What each tool runs where the profile's [signals.commands] has no line for it.
# The headroom forecast is 10 s ahead, as the phone app asks PowerManager.getThermalHeadroom(10).
DEFAULT_LINES = {"tegrastats": "tegrastats --interval 100", "headroom": "cmd thermalservice headroom 10"}


def _argv(tool: str, line: str) -> Tuple[str, ...]:
    """The argv that runs a command line; tegrastats never exits, so ``head`` takes one sample."""
    return ("sh", "-c", f"{line} | head -n 1") if tool == "tegrastats" else tuple(shlex.split(line))


COMMANDS: Dict[str, Sequence[str]] = {  # each tool's argv when the profile does not name it
    tool: _argv(tool, DEFAULT_LINES.get(tool, " ".join(words))) for tool, (words, _) in TOOLS.items()}


def tool_of(line: str) -> Optional[str]:
    """Which of ``TOOLS`` a command line starts (``/opt/vc/bin/vcgencmd measure_temp``: measure_temp)."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    if not words:
        return None
    words[0] = PurePosixPath(words[0]).name
    return next((tool for tool, (known, _) in TOOLS.items() if tuple(words[:len(known)]) == known), None)


def command(table: Mapping[str, Any], tool: str) -> Sequence[str]:
    """The argv for ``tool``: the profile's own line for it where ``[signals.commands]`` has one."""
    line = next((line for line in table.get("commands", {}).values() if tool_of(line) == tool), None)
    return COMMANDS[tool] if line is None else _argv(tool, line)


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
    draw, when the battery or a Jetson input rail reports it. ``android_thermal_headroom`` is Android's
    forecast (1.0: severe throttling begins), only where the profile names ``headroom``. ``errors`` maps
    a signal the profile names (``thermal``, ``headroom``, ``battery``, ``tegrastats``) to why it gave no
    usable reading; a signal that is not named is simply absent. ``zone_errors`` maps each
    temperature sensor that was read (or named) but gave no temperature to why: with several
    sensors, one failing is no ``errors`` line while another reads, yet the switcher must not
    take the others' reading for it.
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
    android_thermal_headroom: Optional[float] = None
    tegrastats: Optional[TegraStats] = None
    errors: Dict[str, str] = field(default_factory=dict)
    zone_errors: Dict[str, str] = field(default_factory=dict)

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


def _keyed(zones: Iterable[ThermalZone]) -> List[Tuple[str, ThermalZone]]:
    """Each zone with its sensor name: the zone's name, and for a name an earlier zone has, the name
    and the zone's directory (``cpu-thermal/thermal_zone2``). Whether a zone reads does not change
    any name, so a failing sensor is never taken for another of the same type."""
    seen: Set[str] = set()
    keyed = []
    for zone in zones:
        keyed.append((zone.name if zone.name not in seen else f"{zone.name}/{zone.zone}", zone))
        seen.add(zone.name)
    return keyed


def _sensor_type(sensor: str) -> str:
    """The name a profile's ``thermal_zones`` gives for a sensor (``cpu-thermal/thermal_zone2``: ``cpu-thermal``)."""
    return sensor.partition("/")[0]


def zone_temperatures(zones: Iterable[ThermalZone]) -> Dict[str, float]:
    """{sensor name: °C} for zones that read; a repeated name gets its directory appended."""
    return {key: zone.temp_c for key, zone in _keyed(zones) if zone.temp_c is not None}


def _zone_errors(zones: Iterable[ThermalZone]) -> Dict[str, str]:
    """{sensor name: why it gave no temperature} for zones that do not read."""
    return {key: f"{zone.zone}: {zone.error}" for key, zone in _keyed(zones) if zone.error is not None}


_THERMAL_DIRS = ("/sys/class/thermal/", "/sys/devices/virtual/thermal/")
_POWER_SUPPLY_DIR = "/sys/class/power_supply/"


def temperature_files(table: Mapping[str, Any]) -> Dict[str, str]:
    """The ``[signals.files]`` that hold a temperature in m°C: keys ending in ``_mC``, zones' ``temp``."""
    return {key: path for key, path in table.get("files", {}).items()
            if key.endswith("_mC") or (path.startswith(_THERMAL_DIRS) and path.endswith("/temp"))}


def battery_folder(table: Mapping[str, Any]) -> Optional[str]:
    """The power supply folder ``[signals.files]`` names (a file in it, e.g. its ``capacity``)."""
    named = (path for path in table.get("files", {}).values() if path.startswith(_POWER_SUPPLY_DIR))
    return next((str(PurePosixPath(path).parent) for path in named), None)


# One function per (signal, value) of the [signals] table. Each returns DeviceState fields, plus
# "error" (why the signal gave nothing usable) and "zone_errors" ({sensor: why it did not read}).
def _sysfs_thermal(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    files = temperature_files(table)
    zones = read_temperature_files(files, root) if files else read_thermal_zones(root, table.get("thermal_zones"))
    if not zones:
        return {"error": f"no thermal zone under {root.rstrip('/')}/sys/class/thermal"}
    return {"thermal_zones": zone_temperatures(zones), "zone_errors": _zone_errors(zones)}


def _sysfs_battery(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    folder = battery_folder(table)
    if folder is None:
        # Batteries first: their draw is the board's; a Mains/USB supply that measures is the fallback.
        supplies = sorted(read_power_supplies(root), key=lambda supply: supply.type != "Battery")
        battery = next((s for s in supplies if s.type == "Battery"), None)
        where = f"under {root.rstrip('/')}/sys/class/power_supply"
    else:
        supplies = [read_power_supply(under(root, folder))] if under(root, folder).is_dir() else []
        battery = supplies[0] if supplies else None
        where = f"at {under(root, folder)}"
    measured = [supply.power_w for supply in supplies if supply.power_w is not None]
    found: Dict[str, Any] = {"power_w": measured[0] if measured else None}
    if battery is None:
        found["error"] = f"no battery {where}"
    else:
        found.update(battery_capacity=battery.capacity, battery_status=battery.status,
                     charging=battery.charging, battery_temp_c=battery.temp_c,
                     error=battery.capacity_error and f"{battery.name} capacity: {battery.capacity_error}")
    return found


def _no_output(argv: Sequence[str]) -> str:
    return f"`{' '.join(argv)}` failed or printed nothing"


def _dumpsys_thermal(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    argv = command(table, "thermalservice")
    text = run(argv)
    thermal = parse_thermalservice(text)
    if thermal is None:
        return {"error": _no_output(argv) if not text else
                "dumpsys thermalservice has neither a status nor a temperature"}
    # A status outside NONE..SHUTDOWN is garbage, as an absurd temperature is: no reading (held, then
    # the hottest band), never a band of its own (-1 would otherwise count as cooler than NONE).
    status = thermal.status if thermal_status_name(thermal.status) is not None else None
    error = None if status is not None else "dumpsys thermalservice has no Thermal Status" if thermal.status is None \
        else f"dumpsys thermalservice Thermal Status {thermal.status} is not one of NONE..SHUTDOWN"
    return {"thermal_zones": thermal.temperatures_c, "android_thermal_status": status, "error": error}


def _cmd_headroom(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    argv = command(table, "headroom")
    text = run(argv)
    if not text:
        return {"error": _no_output(argv)}
    headroom, error = parse_headroom(text)
    return {"android_thermal_headroom": headroom, "error": error}


def _dumpsys_battery(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    argv = command(table, "battery")
    text = run(argv)
    battery = parse_battery(text)
    if battery is None:
        return {"error": _no_output(argv) if not text else "dumpsys battery has no level"}
    error = range_error(battery.level, CAPACITY_RANGE_PCT, "%") if battery.level is not None else None
    return {"battery_capacity": None if error else battery.level, "battery_status": battery.status,
            "charging": battery.charging, "battery_temp_c": battery.temperature_c,
            "error": error and f"dumpsys battery level: {error}"}


def _names_measure_temp(table: Mapping[str, Any]) -> bool:
    """Whether the profile reads the SoC temperature through vcgencmd: ``vcgencmd = true``, or a
    ``measure_temp`` line. A profile naming only ``get_throttled`` reads throttling bits, and a
    vcgencmd that is missing there must not count as a failed temperature sensor."""
    commands = table.get("commands", {}).values()
    return table.get("vcgencmd") is True or any(tool_of(line) == "measure_temp" for line in commands)


def _vcgencmd(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    if _names_measure_temp(table):
        argv = command(table, "measure_temp")
        text = run(argv)
        temp = parse_measure_temp(text)
        error = _no_output(argv) if not text else \
            f"vcgencmd measure_temp printed {text.strip()[:40]!r}" if temp is None else \
            range_error(temp, TEMPERATURE_RANGE_C, "°C")
        found = {"thermal_zones": {} if error else {"vcgencmd": temp}, "zone_errors": {"vcgencmd": error} if error else {}}
    return {**found, "throttling": parse_get_throttled(run(command(table, "get_throttled")))}


def _tegrastats(root: str, run: Runner, table: Mapping[str, Any]) -> Dict[str, Any]:
    argv = command(table, "tegrastats")
    stats = parse_tegrastats(run(argv))
    if stats is None:
        return {"error": _no_output(argv)}
    return {"tegrastats": stats, "power_w": stats.input_power_w()}


_SOURCES: Dict[Tuple[str, Any], Callable[[str, Runner, Mapping[str, Any]], Dict[str, Any]]] = {
    ("thermal", "sysfs"): _sysfs_thermal,
    ("thermal", "dumpsys"): _dumpsys_thermal,
    ("headroom", "cmd"): _cmd_headroom,
    ("battery", "sysfs"): _sysfs_battery,
    ("battery", "dumpsys"): _dumpsys_battery,
    ("vcgencmd", True): _vcgencmd,
    ("tegrastats", True): _tegrastats,
}
SIGNALS = tuple(dict.fromkeys(signal for signal, _ in _SOURCES))
_OFF = (False, None, "none")
# The signals that give a temperature (thermal zones or the Android thermal status).
THERMAL_SIGNALS = ("thermal", "vcgencmd")


def signals_from_profile(table: Mapping[str, Any]) -> Dict[str, Any]:
    """The flat ``read_state`` keys implied by a ``{"files": .., "commands": ..}`` signals table.

    A command is known by the tool it starts, a file by what it holds (``temperature_files``,
    ``battery_folder``). A command outranks a file for the same signal: on a phone the host
    reaches the sysfs path only through adb, while dumpsys is what the framework itself acts on.
    """
    tools = (tool_of(line) for line in table.get("commands", {}).values())
    flat: Dict[str, Any] = dict(TOOLS[tool][1] for tool in tools if tool is not None)
    if temperature_files(table):
        flat.setdefault("thermal", "sysfs")
    if battery_folder(table) is not None:
        flat.setdefault("battery", "sysfs")
    return flat


def reads_every_zone(profile_signals: Mapping[str, Any]) -> bool:
    """Whether the profile reads every thermal zone (``thermal = "sysfs"``, naming no temperature file
    and no ``thermal_zones``) rather than sensors it names. Only then may a sensor that never gave a
    reading be left out: among every zone, one that never reads is a disabled one."""
    return (configured(profile_signals).get("thermal") == "sysfs" and not temperature_files(profile_signals)
            and not profile_signals.get("thermal_zones"))


def configured(profile_signals: Mapping[str, Any]) -> Dict[str, Any]:
    """The signals ``read_state`` reads for this table, flat (``{"thermal": "sysfs", ...}``).

    A signal switched off (``battery = "none"``, false) or never named is absent: for the battery
    that means a board on mains, while a named battery that cannot be read is an error, not mains.
    """
    flat = {**signals_from_profile(profile_signals), **profile_signals}
    return {signal: value for signal, value in flat.items() if signal in SIGNALS and value not in _OFF}


def _source(signal: str, value: Any) -> Callable[[str, Runner, Mapping[str, Any]], Dict[str, Any]]:
    source = _SOURCES.get((signal, value)) if isinstance(value, (str, bool)) else None
    if source is None:
        choices = ", ".join(repr(v) for s, v in _SOURCES if s == signal)
        raise HydraEdgeError(f"[signals] {signal} = {value!r} is not supported; use {choices} "
                             f"or false")
    return source


# How long a whole read may take before it counts as failed: as long as one command may (run_command).
READ_TIMEOUT_S = 10.0


class BoundedReader:
    """``read_state`` on a worker thread, waited for at most ``timeout_s``.

    Files are opened without blocking (``_text.read_file``), but a sysfs read can still block inside
    a driver, and the caller (the switcher's poll) must go on. A read that overruns answers a state
    in which every signal the profile names failed, saying why. At most one read is outstanding:
    while one is stuck, later calls start no other (threads would pile up) and answer that failed
    state at once; the stuck read's result, whenever it comes, is dropped as stale.
    """

    def __init__(self, profile_signals: Mapping[str, Any], root: str = "/", run: Runner = run_command,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        self.profile_signals, self.root, self.run, self.timeout_s = profile_signals, root, run, timeout_s
        self._lock = threading.Lock()
        self._pending: Optional["Future[DeviceState]"] = None
        self._deadline = 0.0  # time.monotonic() by which the pending read must be done

    def __call__(self) -> DeviceState:
        """This read's state, or one in which every named signal failed; a profile error raises."""
        with self._lock:  # two polls at once (the caller's, the poll thread's) share one read
            if self._pending is None or self._pending.done():
                self._pending, self._deadline = self._start(), time.monotonic() + self.timeout_s
            pending, deadline = self._pending, self._deadline
        done, _ = wait([pending], timeout=max(0.0, deadline - time.monotonic()))
        return pending.result() if done else self._overran()

    def _start(self) -> "Future[DeviceState]":
        future: "Future[DeviceState]" = Future()

        def read() -> None:
            try:
                future.set_result(read_state(self.profile_signals, self.root, self.run))
            except Exception as e:  # noqa: BLE001 - raised again to the caller that waits on it
                future.set_exception(e)

        threading.Thread(target=read, name="hydra-sensors", daemon=True).start()  # daemon: one stuck in a
        return future                                                             # driver never blocks exit

    def _overran(self) -> DeviceState:
        why = f"reading the signals took longer than {self.timeout_s:g} s (a driver or command that does not return)"
        return DeviceState(timestamp=time.time(), errors={signal: why for signal in configured(self.profile_signals)})


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
            readings = source(root, run, profile_signals)
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
        zones, unread = _named(zones, unread, keep)
    if unread and not zones:  # no sensor gives a temperature: say why the first one did not
        more = f" (and {len(unread) - 1} more sensors)" if len(unread) > 1 else ""
        errors.setdefault("thermal", next(iter(unread.values())) + more)
    return DeviceState(timestamp=timestamp, thermal_zones=zones, errors=errors, zone_errors=unread, **found)


def _named(zones: Dict[str, float], unread: Dict[str, str],
           keep: Iterable[str]) -> Tuple[Dict[str, float], Dict[str, str]]:
    """Only the sensors ``thermal_zones`` names; one it names that no reader found is unread too, so
    a zone that vanishes (or never was) fails like one that will not read."""
    names = list(keep)
    zones = {name: temp for name, temp in zones.items() if _sensor_type(name) in names}
    unread = {name: error for name, error in unread.items() if _sensor_type(name) in names}
    found = {_sensor_type(name) for name in (*zones, *unread)}
    unread.update({name: f"thermal_zones names {name!r}, but no sensor of that name was found"
                   for name in names if name not in found})
    return zones, unread
