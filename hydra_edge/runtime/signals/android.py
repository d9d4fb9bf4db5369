"""Android signals as text: ``dumpsys thermalservice``, ``cmd thermalservice headroom``, ``dumpsys battery``
and ``getprop``.

A stock phone has no Python, so these parsers run on the host over text fetched with
``adb shell``; on a rooted phone with Python they run on the device just the same.
"""

import math
import re
import struct
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ...records.fields import ANDROID_THERMAL_STATUSES
from ._text import COLON_LINES, integer, number, pairs

THERMAL_STATUS_NAMES = ANDROID_THERMAL_STATUSES  # PowerManager.THERMAL_STATUS_* by value

# BatteryManager.BATTERY_STATUS_* by value, spelt as sysfs spells them so both sources agree.
_BATTERY_STATUS = {1: "Unknown", 2: "Charging", 3: "Discharging", 4: "Not charging", 5: "Full"}
# The ``<source> powered: true`` lines of dumpsys battery, in the order BatteryService checks them.
_PLUG_SOURCES = (("AC powered", "ac"), ("USB powered", "usb"),
                 ("Wireless powered", "wireless"), ("Dock powered", "dock"))

# android.os.Temperature.toString(): Temperature{mValue=41.5, mType=0, mName=CPU0, mStatus=0}
_TEMPERATURE = re.compile(r"Temperature\{mValue=([^,]+), mType=-?\d+, mName=([^,}]+)")
_GETPROP = re.compile(r"^\[([^\]]+)\]: \[(.*)\]\s*$", re.MULTILINE)


# PowerManager.getThermalHeadroom: 1.0 is where SEVERE throttling begins; 0 is no load. What counts as a
# reading: more than 10x the severe point is a broken HAL, not a hot phone, and a negative one is garbage.
HEADROOM_RANGE = (0.0, 10.0)
# The forecast is a Java float: one below its smallest normal value (2^-126), or a figure that is not zero
# yet reads as 0.0, is no forecast a thermal HAL gives but a broken one's (or garbled text).
FLOAT_MIN_NORMAL = 2.0 ** -126
# ``cmd thermalservice headroom 10`` (Android 14+) prints the forecast as Java's Float.toString writes it:
# ASCII digits only (Python's \d would also take Arabic-Indic and full-width ones, which float() reads).
_HEADROOM = re.compile(r"Headroom in \d+ seconds?: (\S+)", re.ASCII)
_JAVA_FLOAT = re.compile(r"NaN|-?Infinity|-?(\d+\.\d+)(?:E-?\d+)?", re.ASCII)


def parse_headroom(text: Optional[str]) -> Tuple[Optional[float], Optional[str]]:
    """``cmd thermalservice headroom N``'s forecast: (headroom, None), or (None, why it is no reading).

    Why not: an ``Error: ...`` line (the thermal HAL is not ready, a forecast outside 0..60 s), any other
    text (digits other than ASCII's included), NaN (the phone cannot forecast, or was asked again within a
    second), a value outside ``HEADROOM_RANGE``, or one no float holds (a denormal, or a non-zero figure that
    underflows to 0.0). Each is a failed read, never a cool phone: the switcher holds the last good
    forecast and then assumes the hottest band.
    """
    line = (text or "").strip()
    if line.startswith("Error:"):
        return None, f"cmd thermalservice headroom: {line[:100]}"
    match = _HEADROOM.fullmatch(line)
    figure = _JAVA_FLOAT.fullmatch(match.group(1)) if match is not None else None
    if match is None or figure is None:
        return None, f"cmd thermalservice headroom printed {line[:60]!r}, not a forecast"
    value = float(match.group(1))
    if math.isnan(value):
        return None, "thermal headroom NaN: the phone cannot forecast now"
    nonzero = figure.group(1) is not None and figure.group(1).strip("0.") != ""
    if (value != 0.0 or nonzero) and abs(_as_float(value)) < FLOAT_MIN_NORMAL:
        return None, f"thermal headroom {match.group(1)} is no float's forecast (below {FLOAT_MIN_NORMAL:g})"
    low, high = HEADROOM_RANGE
    if not low <= value <= high:
        return None, f"thermal headroom {value:g} is outside {low:g}..{high:g} (1.0: severe throttling begins)"
    return value, None


def _as_float(value: float) -> float:
    """``value`` rounded to a Java float (only ever asked of numbers near zero): Float.toString prints the
    smallest normal float as 1.17549435E-38, a hair below 2^-126 until it is read back as a float."""
    return struct.unpack("<f", struct.pack("<f", value))[0] if abs(value) < 1.0 else value


def thermal_status_name(status: Optional[int]) -> Optional[str]:
    """``NONE`` .. ``SHUTDOWN`` for 0 .. 6; None for anything else."""
    in_range = status is not None and 0 <= status < len(THERMAL_STATUS_NAMES)
    return THERMAL_STATUS_NAMES[status] if in_range else None


@dataclass(frozen=True)
class AndroidThermal:
    """``dumpsys thermalservice``: the framework's thermal status and its sensors in °C."""

    status: Optional[int]
    temperatures_c: Dict[str, float]
    status_override: Optional[bool]

    @property
    def status_name(self) -> Optional[str]:
        return thermal_status_name(self.status)


def parse_thermalservice(text: Optional[str]) -> Optional[AndroidThermal]:
    """Parse ``dumpsys thermalservice``; None when the text has neither a status nor a sensor.

    The dump lists cached temperatures first and then, if the HAL is up, a fresh read from the
    HAL; the later reading of a sensor wins. ``status_override`` is true while
    ``cmd thermalservice override-status`` is in force: the status is a test's, not the phone's.
    """
    fields = pairs(COLON_LINES, text)
    temperatures = {}
    for value, name in _TEMPERATURE.findall(text or ""):
        celsius = number(value)
        if celsius is not None:
            temperatures[name.strip()] = celsius
    status = integer(fields.get("Thermal Status"))
    if status is None and not temperatures:
        return None
    override = fields.get("IsStatusOverride")
    return AndroidThermal(status, temperatures, None if override is None else override == "true")


@dataclass(frozen=True)
class AndroidBattery:
    """``dumpsys battery``: level in %, status as sysfs names it, what it is plugged into, °C."""

    level: Optional[int]
    status: Optional[str]
    plugged: Optional[str]
    temperature_c: Optional[float]

    @property
    def charging(self) -> Optional[bool]:
        return None if self.status is None else self.status == "Charging"


def parse_battery(text: Optional[str]) -> Optional[AndroidBattery]:
    """Parse ``dumpsys battery``; None when there is no level in it.

    ``plugged`` is ``ac``, ``usb``, ``wireless`` or ``dock``, ``unplugged`` when every source
    says false, None when the dump has no such lines. Temperature is printed in tenths of °C.
    """
    fields = pairs(COLON_LINES, text)
    level = integer(fields.get("level"))
    if level is None:
        return None
    status = integer(fields.get("status"))
    return AndroidBattery(
        level=level,
        status=_BATTERY_STATUS.get(status, "Unknown") if status is not None else None,
        plugged=_plugged(fields),
        temperature_c=number(fields.get("temperature"), 0.1),
    )


def _plugged(fields: Dict[str, str]) -> Optional[str]:
    present = [(fields[key], name) for key, name in _PLUG_SOURCES if key in fields]
    if not present:
        return None
    return next((name for value, name in present if value == "true"), "unplugged")


def parse_getprop(text: Optional[str]) -> Dict[str, str]:
    """``getprop`` output (``[ro.product.model]: [Pixel 7]``) as a dict."""
    return pairs(_GETPROP, text)
