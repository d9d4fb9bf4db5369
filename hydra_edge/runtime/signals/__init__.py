"""Device-side signals: temperature, battery, power and throttling, read into dataclasses.

Pure standard library (Python 3.9+), so the package can be pushed to a board and run as-is.
``linux`` reads sysfs, vcgencmd and tegrastats; ``android`` parses dumpsys, ``cmd thermalservice headroom``
and getprop text;
``state`` and ``info`` put one reading and one device
description together.
"""

from .android import (HEADROOM_RANGE, THERMAL_STATUS_NAMES, AndroidBattery, AndroidThermal, parse_battery,
                      parse_getprop, parse_headroom, parse_thermalservice, thermal_status_name)
from .info import DeviceInfo, android_device_info, read_device_info
from .linux import (PowerSupply, TegraStats, ThermalZone, Throttling, TripPoint,
                    parse_get_throttled, parse_measure_temp, parse_tegrastats,
                    read_power_supplies, read_thermal_zones)
from .state import (COMMANDS, READ_TIMEOUT_S, SIGNALS, THERMAL_SIGNALS, BoundedReader, DeviceState, Runner,
                    configured, read_state, reads_every_zone, run_command, signals_from_profile, zone_temperatures)

__all__ = [
    "HEADROOM_RANGE", "THERMAL_STATUS_NAMES", "AndroidBattery", "AndroidThermal", "parse_battery", "parse_getprop",
    "parse_headroom", "parse_thermalservice", "thermal_status_name",
    "DeviceInfo", "android_device_info", "read_device_info",
    "PowerSupply", "TegraStats", "ThermalZone", "Throttling", "TripPoint", "parse_get_throttled",
    "parse_measure_temp", "parse_tegrastats", "read_power_supplies", "read_thermal_zones",
    "COMMANDS", "READ_TIMEOUT_S", "SIGNALS", "THERMAL_SIGNALS", "BoundedReader", "DeviceState", "Runner", "configured",
    "read_state", "reads_every_zone", "run_command", "signals_from_profile", "zone_temperatures",
]
