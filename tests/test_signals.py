"""Device-side signals: fake sysfs trees, real-format tool output, and the stdlib-only promise."""

import ast
import errno
import json
import os
import platform
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bounded import within

from hydra_edge.errors import HydraEdgeError
from hydra_edge.runtime.latency import parse_benchmark_model, parse_executor_runner, summarize_latencies
from hydra_edge.runtime.signals import (
    COMMANDS,
    BoundedReader,
    DeviceState,
    Throttling,
    _text,
    android_device_info,
    configured,
    parse_battery,
    parse_get_throttled,
    parse_getprop,
    parse_headroom,
    parse_measure_temp,
    parse_tegrastats,
    parse_thermalservice,
    read_device_info,
    read_power_supplies,
    read_state,
    read_thermal_zones,
    run_command,
    signals_from_profile,
    thermal_status_name,
)
from hydra_edge.runtime.signals import state as state_module

ROOT = Path(__file__).resolve().parents[1]
SIGNALS_DIR = ROOT / "hydra_edge" / "runtime" / "signals"

# --- real-format samples ----------------------------------------------------------------------

# Orin Nano, the tegrastats line of docs/devices.md with the fields it elides filled in.
TEGRA_ORIN_NANO = (
    "RAM 2272/7620MB (lfb 4x4MB) SWAP 0/3810MB (cached 0MB) CPU [2%@729,1%@729,0%@729,0%@729,"
    "off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] cpu@54.9C soc2@55.6C gpu@55.5C tj@56.7C "
    "soc0@54.4C soc1@55.0C VDD_IN 4673mW/4673mW VDD_CPU_GPU_CV 527mW/527mW VDD_SOC 1428mW/1410mW")
# Jetson Nano (JetPack 4): upper-case sensors, rails without a unit, IRAM.
TEGRA_NANO = (
    "RAM 1216/3964MB (lfb 387x4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [3%@102,2%@102,0%@102,0%@102] EMC_FREQ 0%@204 GR3D_FREQ 0%@76 APE 25 PLL@25C "
    "CPU@27.5C PMIC@100C GPU@27C AO@34C thermal@27.5C POM_5V_IN 1004/1004 POM_5V_GPU 0/0 "
    "POM_5V_CPU 123/118")
# AGX Orin (JetPack 5): timestamp, powered-down sensors at -256C, no whole-module rail.
TEGRA_AGX_ORIN = (
    "08-22-2023 10:15:33 RAM 3052/30536MB (lfb 6543x4MB) SWAP 0/15268MB (cached 0MB) "
    "CPU [1%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[0,0] VIC_FREQ 115 APE 174 "
    "cv0@-256C cpu@46.5C soc2@43.187C soc0@43.437C cv1@-256C gpu@-256C tj@46.5C soc1@42.937C "
    "cv2@-256C VDD_GPU_SOC 2387mW/2387mW VDD_CPU_CV 398mW/398mW VIN_SYS_5V0 2323mW/2323mW "
    "VDDQ_VDD2_1V8AO 301mW/301mW")

THERMALSERVICE = """\
IsStatusOverride: false
ThermalEventListeners:
\tcallbacks: 1
\tkilled: false
\tbroadcasts count: -1
ThermalStatusListeners:
\tcallbacks: 3
\tkilled: false
\tbroadcasts count: -1
Thermal Status: 2
Cached temperatures:
\tTemperature{mValue=38.1, mType=3, mName=VIRTUAL-SKIN, mStatus=0}
\tTemperature{mValue=44.2, mType=0, mName=cpu0, mStatus=1}
HAL Ready: true
HAL connection:
\tThermalHAL AIDL 1  connected: yes
Current temperatures from HAL:
\tTemperature{mValue=33.5, mType=2, mName=battery, mStatus=0}
\tTemperature{mValue=45.8, mType=0, mName=cpu0, mStatus=1}
\tTemperature{mValue=41.0, mType=1, mName=gpu0, mStatus=0}
\tTemperature{mValue=NaN, mType=9, mName=npu0, mStatus=0}
\tTemperature{mValue=38.4, mType=3, mName=VIRTUAL-SKIN, mStatus=0}
Current cooling devices from HAL:
\tCoolingDevice{mValue=0, mType=2, mName=thermal-cpufreq-0}
Temperature static thresholds from HAL:
\tTemperatureThreshold{mType=0, mName=cpu0, mHotThrottlingThresholds=[NaN, NaN, NaN, 85.0, 95.0, \
105.0, 115.0], mColdThrottlingThresholds=[NaN, NaN, NaN, NaN, NaN, NaN, NaN]}
"""

BATTERY_CHARGING = """\
Current Battery Service state:
  AC powered: false
  USB powered: true
  Wireless powered: false
  Dock powered: false
  Max charging current: 500000
  Max charging voltage: 5000000
  Charge counter: 3526000
  status: 2
  health: 2
  present: true
  level: 78
  scale: 100
  voltage: 4123
  temperature: 312
  technology: Li-ion
  Charging state: 1
  Charging policy: 1
"""

# After `dumpsys battery unplug` and `dumpsys battery set level 15` (Android 9: no Dock line).
BATTERY_UNPLUGGED = """\
Current Battery Service state:
  (UPDATES STOPPED -- use 'reset' to restart)
  AC powered: false
  USB powered: false
  Wireless powered: false
  Max charging current: 0
  status: 3
  health: 2
  present: true
  level: 15
  scale: 100
  voltage: 3702
  temperature: 287
  technology: Li-ion
"""

GETPROP = """\
[ro.build.version.release]: [14]
[ro.build.version.sdk]: [34]
[ro.product.cpu.abi]: [arm64-v8a]
[ro.product.manufacturer]: [Google]
[ro.product.model]: [Pixel 7]
[ro.soc.model]: [GS201]
"""

BENCHMARK_MODEL = """\
INFO: STARTING!
INFO: Log parameter values verbosely: [0]
INFO: Num threads: [4]
INFO: Graph: [/data/local/tmp/vit_h6_xnnpack_fp32.tflite]
INFO: #threads used for CPU inference: [4]
INFO: Loaded model /data/local/tmp/vit_h6_xnnpack_fp32.tflite
INFO: Initialized TensorFlow Lite runtime.
INFO: Created TensorFlow Lite XNNPACK delegate for CPU.
INFO: The input model file size (MB): 22.1427
INFO: Initialized session in 85.123ms.
INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if \
exceeding 150 seconds.
INFO: count=21 first=31245 curr=23412 min=23011 max=31245 avg=23890.2 std=1702

INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if \
exceeding 150 seconds.
INFO: count=50 first=23501 curr=23398 min=22987 max=25120 avg=23456.7 std=412

INFO: Inference timings in us: Init: 85123, First inference: 31245, Warmup (avg): 23890.2, \
Inference (avg): 23456.7
INFO: Note: as the benchmark tool itself affects memory footprint, the following is only \
APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at \
your discretion.
INFO: Memory footprint delta from the start of the tool (MB): init=45.2109 overall=52.8867
INFO: Overall peak memory footprint (MB) via periodic monitoring: 61.3281
INFO: Memory status at the end of exeution:
INFO: - VmRSS              : 63 MB
"""

EXECUTOR_RUNNER = """\
I 00:00:00.000612 executorch:executor_runner.cpp:178] Model file vit_h6.pte is loaded.
I 00:00:00.000650 executorch:executor_runner.cpp:188] Using method forward
I 00:00:00.000655 executorch:executor_runner.cpp:235] Setting up CPU planned buffer 0, size 1204224.
I 00:00:00.081234 executorch:executor_runner.cpp:281] Model loaded in 80.571000 ms.
I 00:00:00.112001 executorch:executor_runner.cpp:455] Iteration 1 of 5: 30.702000 ms
I 00:00:00.134101 executorch:executor_runner.cpp:455] Iteration 2 of 5: 22.100000 ms
I 00:00:00.156001 executorch:executor_runner.cpp:455] Iteration 3 of 5: 21.900000 ms
I 00:00:00.178401 executorch:executor_runner.cpp:455] Iteration 4 of 5: 22.400000 ms
I 00:00:00.200101 executorch:executor_runner.cpp:455] Iteration 5 of 5: 21.700000 ms
I 00:00:00.200150 executorch:executor_runner.cpp:470] Model executed successfully 5 time(s) in \
118.802000 ms.
I 00:00:00.200160 executorch:executor_runner.cpp:474] 1 outputs: 
OutputX 0: tensor(sizes=[1, 10], [0.12, -0.3, ...])
"""

PI_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n\n"
    for i in range(4)) + "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"


# --- fake sysfs -------------------------------------------------------------------------------

def write_tree(root: Path, files: dict) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


TZ = "sys/class/thermal/"
PS = "sys/class/power_supply/"
BOARD = {
    TZ + "thermal_zone0/type": "cpu-thermal\n",
    TZ + "thermal_zone0/temp": "48312\n",
    TZ + "thermal_zone0/trip_point_0_temp": "80000\n",
    TZ + "thermal_zone0/trip_point_0_type": "passive\n",
    TZ + "thermal_zone0/trip_point_1_temp": "110000\n",
    TZ + "thermal_zone0/trip_point_1_type": "critical\n",
    TZ + "thermal_zone1/type": "gpu-thermal\n",
    TZ + "thermal_zone1/temp": "51000\n",
    TZ + "thermal_zone2/type": "cpu-thermal\n",  # a second zone with the same name
    TZ + "thermal_zone2/temp": "47000\n",
    TZ + "thermal_zone3/type": "soc0-thermal\n",  # no temp file: a sensor that will not read
    TZ + "thermal_zone10/type": "tj-thermal\n",
    TZ + "thermal_zone10/temp": "53500\n",
    PS + "BAT0/type": "Battery\n",
    PS + "BAT0/status": "Discharging\n",
    PS + "BAT0/capacity": "76\n",
    PS + "BAT0/current_now": "-1200000\n",
    PS + "BAT0/voltage_now": "7600000\n",
    PS + "BAT0/temp": "291\n",
    PS + "AC/type": "Mains\n",
    PS + "AC/online": "0\n",
}


@pytest.fixture
def board(tmp_path: Path) -> Path:
    return write_tree(tmp_path, BOARD)


def fake_runner(outputs: dict):
    """A runner answering known argv with canned text, None (command missing) otherwise."""
    calls = []

    def run(argv):
        calls.append(tuple(argv))
        return outputs.get(tuple(argv))

    run.calls = calls
    return run


# --- sysfs ------------------------------------------------------------------------------------

def test_thermal_zones_are_read_in_index_order_with_trip_points(board: Path):
    zones = read_thermal_zones(str(board))
    assert [z.zone for z in zones] == [f"thermal_zone{i}" for i in (0, 1, 2, 3, 10)]
    cpu = zones[0]
    assert (cpu.name, cpu.temp_c) == ("cpu-thermal", pytest.approx(48.312))
    assert [(t.temp_c, t.type) for t in cpu.trip_points] == [(80.0, "passive"), (110.0, "critical")]
    assert zones[3].name == "soc0-thermal" and zones[3].temp_c is None
    assert zones[1].trip_points == ()


def test_power_supplies_give_capacity_status_and_measured_power(board: Path):
    ac, battery = read_power_supplies(str(board))
    assert (battery.type, battery.status, battery.capacity) == ("Battery", "Discharging", 76)
    assert battery.power_w == pytest.approx(1.2 * 7.6)
    assert battery.temp_c == pytest.approx(29.1)
    assert (ac.type, ac.online, ac.capacity, ac.power_w) == ("Mains", False, None, None)


def test_power_now_is_preferred_over_current_times_voltage(tmp_path: Path):
    write_tree(tmp_path, {PS + "battery/type": "Battery", PS + "battery/power_now": "5500000",
                          PS + "battery/current_now": "1", PS + "battery/voltage_now": "1"})
    assert read_power_supplies(str(tmp_path))[0].power_w == pytest.approx(5.5)


def test_sysfs_state_from_a_board(board: Path):
    state = read_state({"thermal": "sysfs", "battery": "sysfs"}, root=str(board),
                       run=fake_runner({}))
    assert state.thermal_zones == {"cpu-thermal": pytest.approx(48.312), "gpu-thermal": 51.0,
                                   "cpu-thermal/thermal_zone2": 47.0, "tj-thermal": 53.5}
    assert state.max_temp_c == 53.5
    assert (state.battery_capacity, state.battery_status, state.charging) == (76, "Discharging",
                                                                              False)
    assert state.power_w == pytest.approx(9.12)
    assert state.battery_temp_c == pytest.approx(29.1)


def test_sysfs_state_follows_files_that_change(board: Path):
    signals = {"thermal": "sysfs", "battery": "sysfs"}
    (board / PS / "BAT0/status").write_text("Charging\n")
    (board / TZ / "thermal_zone1/temp").write_text("88500\n")
    state = read_state(signals, root=str(board), run=fake_runner({}))
    assert state.charging is True and state.max_temp_c == 88.5


def test_thermal_zones_key_keeps_only_named_sensors(board: Path):
    state = read_state({"thermal": "sysfs", "thermal_zones": ["gpu-thermal"]}, root=str(board))
    assert state.thermal_zones == {"gpu-thermal": 51.0}


def test_missing_everything_gives_none_not_a_crash(tmp_path: Path):
    signals = {"thermal": "sysfs", "battery": "sysfs", "vcgencmd": True, "tegrastats": True}
    run = fake_runner({})
    state = read_state(signals, root=str(tmp_path / "no-such-root"), run=run)
    assert state.thermal_zones == {} and state.max_temp_c is None
    assert all(getattr(state, name) is None for name in (
        "battery_capacity", "battery_status", "charging", "battery_temp_c", "power_w",
        "throttling", "android_thermal_status", "tegrastats"))
    assert set(run.calls) == {tuple(COMMANDS[k]) for k in ("measure_temp", "get_throttled",
                                                           "tegrastats")}


def test_battery_without_any_readable_attribute(tmp_path: Path):
    write_tree(tmp_path, {PS + "BAT1/type": "Battery"})
    state = read_state({"battery": "sysfs"}, root=str(tmp_path))
    assert (state.battery_capacity, state.battery_status, state.charging, state.power_w) == (
        None, None, None, None)


# --- Raspberry Pi -----------------------------------------------------------------------------

def test_vcgencmd_temperature():
    assert parse_measure_temp("temp=48.3'C\n") == pytest.approx(48.3)
    assert parse_measure_temp("VCHI initialization failed\n") is None
    assert parse_measure_temp(None) is None


def test_get_throttled_decodes_now_and_since_boot_bits():
    past = parse_get_throttled("throttled=0x50000\n")
    assert past.raw == 0x50000
    assert past.under_voltage_occurred and past.throttled_occurred
    assert not (past.arm_freq_capped_occurred or past.soft_temp_limit_occurred)
    assert not past.any_now
    now = parse_get_throttled("throttled=0xe000e")
    assert (now.under_voltage, now.arm_freq_capped, now.throttled, now.soft_temp_limit) == (
        False, True, True, True)
    assert now.any_now and now.soft_temp_limit_occurred and not now.under_voltage_occurred
    assert parse_get_throttled("throttled=0x0") == Throttling.from_raw(0)
    assert parse_get_throttled("error=1") is None


def test_pi_state_joins_sysfs_and_vcgencmd(board: Path):
    run = fake_runner({tuple(COMMANDS["measure_temp"]): "temp=49.1'C\n",
                       tuple(COMMANDS["get_throttled"]): "throttled=0x50005\n"})
    state = read_state({"thermal": "sysfs", "vcgencmd": True}, root=str(board), run=run)
    assert state.thermal_zones["vcgencmd"] == pytest.approx(49.1)
    assert state.thermal_zones["gpu-thermal"] == 51.0
    assert state.throttling.under_voltage and state.throttling.throttled
    assert state.battery_capacity is None


# --- Jetson -----------------------------------------------------------------------------------

def test_tegrastats_orin_nano_line():
    stats = parse_tegrastats(TEGRA_ORIN_NANO)
    assert (stats.ram_used_mb, stats.ram_total_mb, stats.swap_used_mb, stats.swap_total_mb) == (
        2272, 7620, 0, 3810)
    assert stats.temps_c == {"cpu": 54.9, "soc2": 55.6, "gpu": 55.5, "tj": 56.7, "soc0": 54.4,
                             "soc1": 55.0}
    assert stats.power_mw == {"VDD_IN": 4673.0, "VDD_CPU_GPU_CV": 527.0, "VDD_SOC": 1428.0}
    assert stats.power_avg_mw["VDD_SOC"] == 1410.0
    assert stats.input_power_w() == pytest.approx(4.673)


def test_tegrastats_nano_line_with_unitless_rails():
    stats = parse_tegrastats(TEGRA_NANO)
    assert (stats.ram_used_mb, stats.ram_total_mb) == (1216, 3964)
    assert stats.temps_c["CPU"] == 27.5 and stats.temps_c["PMIC"] == 100.0
    assert stats.power_mw == {"POM_5V_IN": 1004.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 123.0}
    assert stats.power_avg_mw["POM_5V_CPU"] == 118.0
    assert "IRAM" not in stats.power_mw and "RAM" not in stats.power_mw
    assert stats.input_power_w() == pytest.approx(1.004)


def test_tegrastats_agx_orin_drops_powered_down_sensors_and_has_no_input_rail():
    stats = parse_tegrastats("garbage first line\n" + TEGRA_AGX_ORIN + "\n")
    assert stats.temps_c == {"cpu": 46.5, "soc2": 43.187, "soc0": 43.437, "tj": 46.5,
                             "soc1": 42.937}
    assert set(stats.power_mw) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert stats.input_power_w() is None
    assert parse_tegrastats("") is None and parse_tegrastats("sh: tegrastats: not found") is None


def test_jetson_state_takes_power_from_the_input_rail(tmp_path: Path):
    run = fake_runner({tuple(COMMANDS["tegrastats"]): TEGRA_ORIN_NANO + "\n"})
    state = read_state({"battery": "sysfs", "tegrastats": True}, root=str(tmp_path), run=run)
    assert state.power_w == pytest.approx(4.673)
    assert state.tegrastats.temps_c["tj"] == 56.7
    assert state.thermal_zones == {}


# --- Android ----------------------------------------------------------------------------------

def test_thermalservice_status_and_fresh_hal_temperatures():
    thermal = parse_thermalservice(THERMALSERVICE)
    assert (thermal.status, thermal.status_name, thermal.status_override) == (2, "MODERATE",
                                                                              False)
    assert thermal.temperatures_c == {"VIRTUAL-SKIN": 38.4, "cpu0": 45.8, "battery": 33.5,
                                      "gpu0": 41.0}
    overridden = parse_thermalservice("IsStatusOverride: true\nThermal Status: 4\n")
    assert overridden.status_name == "CRITICAL" and overridden.status_override is True
    assert parse_thermalservice("Can't find service: thermalservice") is None


def test_thermal_status_names():
    names = [thermal_status_name(i) for i in range(7)]
    assert names == ["NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN"]
    assert thermal_status_name(7) is None and thermal_status_name(-1) is None
    assert thermal_status_name(None) is None


def test_dumpsys_battery_charging_over_usb():
    battery = parse_battery(BATTERY_CHARGING)
    assert (battery.level, battery.status, battery.plugged) == (78, "Charging", "usb")
    assert battery.charging is True
    assert battery.temperature_c == pytest.approx(31.2)


def test_dumpsys_battery_unplugged():
    battery = parse_battery(BATTERY_UNPLUGGED)
    assert (battery.level, battery.status, battery.plugged, battery.charging) == (
        15, "Discharging", "unplugged", False)
    assert battery.temperature_c == pytest.approx(28.7)
    assert parse_battery("  level: 50\n").plugged is None
    assert parse_battery("") is None and parse_battery(None) is None


def test_android_state_over_an_injected_runner():
    run = fake_runner({tuple(COMMANDS["thermalservice"]): THERMALSERVICE,
                       tuple(COMMANDS["battery"]): BATTERY_CHARGING})
    state = read_state({"thermal": "dumpsys", "battery": "dumpsys"}, run=run)
    assert state.android_thermal_status == 2
    assert state.android_thermal_status_name == "MODERATE"
    assert state.max_temp_c == 45.8
    assert (state.battery_capacity, state.battery_status, state.charging) == (78, "Charging", True)
    assert state.battery_temp_c == pytest.approx(31.2)
    assert state.power_w is None


# ``cmd thermalservice headroom 10`` on Android 14+: the forecast as Java's Float.toString prints it.
@pytest.mark.parametrize("text, headroom", [
    ("Headroom in 10 seconds: 0.53\n", 0.53),
    ("Headroom in 10 seconds: 1.0", 1.0),
    ("Headroom in 0 seconds: 0.0\n", 0.0),
    ("Headroom in 60 seconds: 1.0E-5\n", 1e-5),
    ("Headroom in 10 seconds: 10.0\n", 10.0),
])
def test_a_thermal_headroom_forecast_is_read(text: str, headroom: float):
    assert parse_headroom(text) == (headroom, None)


@pytest.mark.parametrize("text, why", [
    ("Headroom in 10 seconds: NaN\n", "thermal headroom NaN: the phone cannot forecast now"),
    ("Error: thermal HAL is not ready\n", "cmd thermalservice headroom: Error: thermal HAL is not ready"),
    ("Error: forecast second input should be in range [0,60]\n",
     "cmd thermalservice headroom: Error: forecast second input should be in range [0,60]"),
    ("Headroom in 10 seconds: -0.25\n", "thermal headroom -0.25 is outside 0..10"),
    ("Headroom in 10 seconds: 11.0\n", "thermal headroom 11 is outside 0..10"),
    ("Headroom in 10 seconds: Infinity\n", "thermal headroom inf is outside 0..10"),
    ("Headroom in 10 seconds: 0.5 C\n", "printed 'Headroom in 10 seconds: 0.5 C', not a forecast"),
    ("Headroom in 10 seconds: 0x1p-1\n", "not a forecast"),
    ("Headroom in 10 seconds: 1_0.0\n", "not a forecast"),
    ("Unknown command: headroom\n", "printed 'Unknown command: headroom', not a forecast"),
    ("", "printed '', not a forecast"),
])
def test_a_thermal_headroom_that_is_no_forecast_says_why(text: str, why: str):
    headroom, said = parse_headroom(text)
    assert headroom is None and why in said and "\n" not in said


@pytest.mark.parametrize("figure", ["\u0660.\u0665", "\uff10.\uff15", "0.\u0665", "\u0661.0E-5", "0.5\u0663"])
def test_a_forecast_in_digits_android_never_prints_is_no_forecast(figure: str):
    """Python's float() reads Arabic-Indic and full-width digits; Float.toString writes ASCII only."""
    for text in (f"Headroom in 10 seconds: {figure}", "Headroom in \uff11\uff10 seconds: 0.5"):
        headroom, said = parse_headroom(text)
        assert headroom is None and "not a forecast" in said, (text, headroom)


@pytest.mark.parametrize("figure", ["1.0E-400", "1.0E-40", "1.4E-45", "1.1754942E-38", "-1.0E-40"])
def test_a_forecast_no_float_holds_is_no_forecast(figure: str):
    """A figure that underflows to 0.0, or a denormal float: a broken HAL's, not a cool phone."""
    headroom, said = parse_headroom(f"Headroom in 10 seconds: {figure}")
    assert headroom is None and ("no float's forecast" in said or "outside" in said), said


def java_float_to_string(f: np.float32) -> str:
    """What Float.toString prints for ``f`` (its shortest digits; plain from 1e-3 to 1e7, else 1.0E-5)."""
    if np.isnan(f):
        return "NaN"
    if np.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    if f == 0 or 1e-3 <= abs(f) < 1e7:
        return np.format_float_positional(f, unique=True, trim="0")
    return np.format_float_scientific(f, unique=True, trim="0", exp_digits=1).replace("e+", "E").replace("e", "E")


@settings(max_examples=2000, deadline=None)
@given(st.floats(width=32))
def test_every_float_a_phone_prints_reads_back_as_itself_or_as_a_failed_read(f: float):
    """Generated over every float32: a forecast in 0..10 that is a normal float (or zero) reads as that
    float; any other (negative, over 10, a denormal, NaN, infinite) is a failed read, never a reading."""
    value = np.float32(f)
    headroom, said = parse_headroom(f"Headroom in 10 seconds: {java_float_to_string(value)}\n")
    usable = 0.0 <= value <= 10.0 and (value == 0 or abs(value) >= np.finfo(np.float32).tiny)
    if usable:
        assert said is None and np.float32(headroom) == value, (value, headroom, said)
    else:
        assert headroom is None and said and "\n" not in said, (value, headroom)


@settings(max_examples=500, deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_any_other_text_after_the_prefix_is_read_as_python_would_never_stand_in(text: str):
    """Whatever follows the prefix, the answer is a reading only where Float.toString could have printed it."""
    headroom, said = parse_headroom(f"Headroom in 10 seconds: {text}")
    if headroom is not None:
        assert text.strip().isascii() and float(text) == headroom and 0.0 <= headroom <= 10.0
    else:
        assert said and "\n" not in said


def test_the_headroom_a_profile_names_is_read_and_a_failed_one_is_an_error():
    line = ("cmd", "thermalservice", "headroom", "10")
    assert COMMANDS["headroom"] == line  # the forecast the app asks PowerManager for: 10 s ahead
    signals = PROFILE_TABLES["android"]
    good = read_state(signals, run=fake_runner({line: "Headroom in 10 seconds: 0.53\n",
                                                tuple(COMMANDS["thermalservice"]): THERMALSERVICE,
                                                tuple(COMMANDS["battery"]): BATTERY_CHARGING}))
    assert good.android_thermal_headroom == 0.53 and good.errors == {}
    assert DeviceState.from_dict(good.to_dict()).android_thermal_headroom == 0.53
    nan = read_state(signals, run=fake_runner({line: "Headroom in 10 seconds: NaN\n"}))
    assert nan.android_thermal_headroom is None and nan.errors["headroom"].startswith("thermal headroom NaN")
    failed = read_state(signals, run=fake_runner({}))
    assert failed.errors["headroom"] == "`cmd thermalservice headroom 10` failed or printed nothing"
    other = read_state({"commands": {"headroom": "cmd thermalservice headroom 30"}},
                       run=fake_runner({("cmd", "thermalservice", "headroom", "30"): "Headroom in 30 seconds: 0.9"}))
    assert other.android_thermal_headroom == 0.9  # the profile's own forecast period
    unnamed = read_state({"thermal": "dumpsys"}, run=fake_runner({line: "Headroom in 10 seconds: 0.53\n"}))
    assert unnamed.android_thermal_headroom is None and "headroom" not in unnamed.errors


def test_getprop_and_android_device_info():
    props = parse_getprop(GETPROP)
    assert props["ro.product.model"] == "Pixel 7"
    info = android_device_info(props)
    assert (info.model, info.cpu_model, info.arch, info.os) == ("Pixel 7", "GS201", "arm64-v8a",
                                                                "Android 14")
    assert (info.kernel, info.python, info.cores) == (None, None, None)
    assert android_device_info({}).os is None


# --- the [signals] table ----------------------------------------------------------------------

def test_unknown_signal_value_is_a_profile_error():
    with pytest.raises(HydraEdgeError, match=r"thermal = 'sysf'.*'sysfs'"):
        read_state({"thermal": "sysf"}, run=fake_runner({}))
    with pytest.raises(HydraEdgeError, match=r"vcgencmd = \['yes'\].*True or false"):
        read_state({"vcgencmd": ["yes"]}, run=fake_runner({}))


def test_switched_off_and_foreign_keys_are_skipped(board: Path):
    run = fake_runner({})
    state = read_state({"thermal": "sysfs", "vcgencmd": False, "tegrastats": None,
                        "power_mode": "nvpmodel"}, root=str(board), run=run)
    assert run.calls == [] and state.max_temp_c == 53.5


def test_state_round_trips_through_json(board: Path):
    run = fake_runner({tuple(COMMANDS["get_throttled"]): "throttled=0x50000",
                       tuple(COMMANDS["tegrastats"]): TEGRA_NANO,
                       tuple(COMMANDS["thermalservice"]): "Thermal Status: 3"})
    state = read_state({"thermal": "sysfs", "battery": "sysfs", "vcgencmd": True,
                        "tegrastats": True}, root=str(board), run=run)
    state = DeviceState(**{**vars(state), "android_thermal_status": 3,
                            "errors": {"battery": "BAT0 capacity: 250 % is outside 0..100 %"}})
    data = json.loads(json.dumps(state.to_dict()))
    assert data["max_temp_c"] == 53.5 and data["android_thermal_status_name"] == "SEVERE"
    assert data["throttling"]["throttled_occurred"] is True
    assert DeviceState.from_dict(data) == state


# --- sensors that fail ----------------------------------------------------------------------
# A signal the profile names but that gives no usable value is an error with its reason, so the
# switcher can tell it from a signal that is not there (a board on mains has no battery).

def spoil(path: Path, bad: str) -> None:
    """Make a sysfs attribute misbehave: garbage text, a directory, or a dangling link."""
    path.unlink()
    if bad == "directory":
        path.mkdir()
    elif bad == "dangling":
        path.symlink_to(path.with_name("gone"))
    else:
        path.write_text(bad)


@pytest.fixture
def denied(monkeypatch: pytest.MonkeyPatch) -> set:
    """Paths that fail with EACCES or EIO at the one function that opens device files (root ignores chmod)."""
    paths: dict = {}
    read_file = _text.read_file

    def fail(path, *limit):
        code = paths.get(Path(path))
        if code is not None:
            raise OSError(code, os.strerror(code), str(path))
        return read_file(path, *limit)

    monkeypatch.setattr(_text, "read_file", fail)
    return paths


@pytest.mark.parametrize("bad, why", [
    ("garbage\n", "reads 'garbage', not a number"), ("", "reads '', not a number"),
    ("nan\n", "reads 'nan', not a number"), ("1000000000\n", "1e+06 °C is outside -50..150 °C"),
    ("-300000\n", "-300 °C is outside -50..150 °C"), ("directory", "is a folder"),
    ("dangling", "FileNotFoundError"), ("EACCES", "PermissionError: [Errno 13] Permission denied"),
    ("EIO", "OSError: [Errno 5] Input/output error")])
def test_a_temperature_that_will_not_read_is_an_error_with_its_reason(tmp_path: Path, denied: dict, bad: str,
                                                                      why: str):
    write_tree(tmp_path, {TZ + "thermal_zone0/type": "cpu-thermal\n", TZ + "thermal_zone0/temp": "48312\n"})
    temp = tmp_path / TZ / "thermal_zone0/temp"
    if bad in ("EACCES", "EIO"):
        denied[temp] = getattr(errno, bad)
    else:
        spoil(temp, bad)
    (zone,) = read_thermal_zones(str(tmp_path))
    assert zone.temp_c is None and why in zone.error
    state = read_state({"thermal": "sysfs"}, root=str(tmp_path))
    assert state.max_temp_c is None and why in state.errors["thermal"]
    assert state.errors["thermal"].startswith("thermal_zone0: ")


LENIENT = ["45_000\n", "\uff14\uff15\uff10\uff10\uff10\n", "4.5e4\n", "-0\n", "45000.0\n", "+45000\n", "045000\n",
           "0x afc8\n", "45000 mC\n", "45000\n45000\n"]


@pytest.mark.parametrize("text", LENIENT)
def test_a_sensor_file_that_is_not_a_plain_ascii_integer_is_a_failed_read(board: Path, text: str):
    """The kernel writes a sensor as a plain ASCII integer (``%d``): Python's float() also takes 45_000,
    full-width digits, 4.5e4 and -0, which would read a garbled file as a cool board and buy heads."""
    spoil(board / TZ / "thermal_zone0/temp", text)
    (zone, *_) = read_thermal_zones(str(board))
    assert zone.temp_c is None and "not a plain integer" in zone.error, zone
    spoil(board / PS / "BAT0/capacity", text.replace("45", "4").replace("\uff15", ""))
    state = read_state({"battery": "sysfs"}, root=str(board))
    assert state.battery_capacity is None and "not a plain integer" in state.errors["battery"], state.errors
    spoil(board / TZ / "thermal_zone0/temp", "-5000\n")  # a plain integer below zero is a reading
    assert read_thermal_zones(str(board))[0].temp_c == -5.0


def test_one_zone_that_will_not_read_is_no_error_while_others_read(board: Path):
    spoil(board / TZ / "thermal_zone0/temp", "garbage\n")
    state = read_state({"thermal": "sysfs"}, root=str(board))
    assert state.max_temp_c == 53.5 and state.errors == {}
    assert sorted(state.zone_errors) == ["cpu-thermal", "soc0-thermal"]  # soc0-thermal has no temp file
    assert state.zone_errors["cpu-thermal"].startswith("thermal_zone0: ")
    assert "'garbage'" in state.zone_errors["cpu-thermal"]
    only = read_state({"thermal": "sysfs", "thermal_zones": ["cpu-thermal"]}, root=str(board))
    # the second cpu-thermal reads, under its own name: a sensor's name never depends on another's failing
    assert only.thermal_zones == {"cpu-thermal/thermal_zone2": 47.0} and only.errors == {}
    assert list(only.zone_errors) == ["cpu-thermal"]
    spoil(board / TZ / "thermal_zone1/temp", "directory")
    gpu = read_state({"thermal": "sysfs", "thermal_zones": ["gpu-thermal"]}, root=str(board))
    assert gpu.thermal_zones == {} and "is a folder" in gpu.errors["thermal"]


def test_no_thermal_zone_at_all_is_an_error_when_the_profile_names_one(tmp_path: Path):
    state = read_state({"thermal": "sysfs"}, root=str(tmp_path))
    assert state.errors == {"thermal": f"no thermal zone under {tmp_path}/sys/class/thermal"}


def test_a_named_zone_that_is_not_there_is_a_sensor_that_failed(board: Path):
    state = read_state({"thermal": "sysfs", "thermal_zones": ["gpu-thermal", "npu-thermal"]}, root=str(board))
    assert state.thermal_zones == {"gpu-thermal": 51.0} and state.errors == {}
    assert state.zone_errors == {"npu-thermal": "thermal_zones names 'npu-thermal', but no sensor of that name "
                                                "was found"}



def test_a_profile_naming_only_get_throttled_reads_no_vcgencmd_temperature(board: Path):
    """Throttling bits are not a temperature sensor: without vcgencmd, the named file still decides."""
    table = {"files": {"temperature_mC": "/sys/class/thermal/thermal_zone0/temp"},
             "commands": {"throttled": "vcgencmd get_throttled"}}
    calls: list = []
    state = read_state(table, root=str(board), run=lambda argv: calls.append(tuple(argv)))
    assert calls == [("vcgencmd", "get_throttled")] and state.throttling is None
    assert "vcgencmd" not in state.zone_errors and state.max_temp_c is not None
    named = {**table, "commands": {**table["commands"], "temperature": "vcgencmd measure_temp"}}
    assert "vcgencmd" in read_state(named, root=str(board), run=lambda argv: None).zone_errors


@pytest.fixture
def fifo(tmp_path: Path):
    """Turns a sysfs attribute into a FIFO (a plain open of it blocks until a writer comes); releases
    any reader left blocked on it when the test ends."""
    made: list = []

    def make(path: Path) -> None:
        path.unlink()
        os.mkfifo(path)
        made.append(path)

    yield make
    for path in made:
        try:  # a writer that opens and closes gives a blocked reader end-of-file
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader left: nothing to release
            pass


def test_a_fifo_as_a_temperature_is_a_failed_sensor_not_a_hang(board: Path, fifo):
    fifo(board / TZ / "thermal_zone1/temp")
    zones = within(10, lambda: read_thermal_zones(str(board)))
    assert zones[1].temp_c is None and "is a FIFO" in zones[1].error
    state = within(10, lambda: read_state({"thermal": "sysfs", "thermal_zones": ["gpu-thermal"]}, root=str(board)))
    assert state.thermal_zones == {} and "is a FIFO" in state.errors["thermal"]


def test_a_fifo_as_a_trip_point_is_skipped_and_the_zone_still_reads(board: Path, fifo):
    fifo(board / TZ / "thermal_zone0/trip_point_0_temp")
    zone = within(10, lambda: read_thermal_zones(str(board)))[0]
    assert zone.temp_c == pytest.approx(48.312) and [t.temp_c for t in zone.trip_points] == [110.0]


def test_a_fifo_as_a_zone_type_leaves_the_zone_named_by_its_folder(board: Path, fifo):
    fifo(board / TZ / "thermal_zone1/type")
    zone = within(10, lambda: read_thermal_zones(str(board)))[1]
    assert (zone.name, zone.temp_c) == ("thermal_zone1", 51.0)


def test_a_huge_sensor_file_is_refused_after_a_page(board: Path):
    temp = board / TZ / "thermal_zone0/temp"
    with temp.open("r+b") as f:
        f.truncate(64 << 20)  # 64 MiB (sparse): "48312" and then NULs
    (zone, *_) = read_thermal_zones(str(board))
    assert zone.temp_c is None and "larger than 4096 bytes" in zone.error


@pytest.mark.parametrize("bad, why", [
    ("-5\n", "-5 % is outside 0..100 %"), ("250\n", "250 % is outside 0..100 %"),
    ("abc\n", "not a number"), ("directory", "is a folder"), ("EACCES", "PermissionError")])
def test_a_battery_level_that_will_not_read_is_an_error_not_mains(board: Path, denied: dict, bad: str, why: str):
    capacity = board / PS / "BAT0/capacity"
    if bad == "EACCES":
        denied[capacity] = errno.EACCES
    else:
        spoil(capacity, bad)
    state = read_state({"battery": "sysfs"}, root=str(board))
    assert state.battery_capacity is None and state.battery_status == "Discharging"
    assert state.errors["battery"].startswith("BAT0 capacity: ") and why in state.errors["battery"]


def test_a_named_battery_that_is_missing_is_an_error_and_one_switched_off_is_not_read(tmp_path: Path):
    write_tree(tmp_path, {PS + "AC/type": "Mains\n", PS + "AC/online": "1\n"})
    state = read_state({"battery": "sysfs"}, root=str(tmp_path))
    assert state.errors == {"battery": f"no battery under {tmp_path}/sys/class/power_supply"}
    off = {"files": {"capacity": "/sys/class/power_supply/battery/capacity"}, "battery": "none"}
    assert configured(off) == {} and read_state(off, root=str(tmp_path)).errors == {}
    assert configured({"files": {"capacity": "/sys/class/power_supply/battery/capacity"}}) == {"battery": "sysfs"}


def test_dumpsys_that_fails_or_makes_no_sense_is_an_error():
    failed = read_state({"thermal": "dumpsys", "battery": "dumpsys"}, run=fake_runner({}))
    assert failed.errors == {"thermal": "`dumpsys thermalservice` failed or printed nothing",
                             "battery": "`dumpsys battery` failed or printed nothing"}
    odd = read_state({"thermal": "dumpsys", "battery": "dumpsys"}, run=fake_runner({
        tuple(COMMANDS["thermalservice"]): "Temperature{mValue=41.5, mType=0, mName=CPU0, mStatus=0}",
        tuple(COMMANDS["battery"]): "  level: 150\n  status: 2\n"}))
    assert odd.max_temp_c == 41.5 and odd.android_thermal_status is None and odd.battery_capacity is None
    assert odd.errors == {"thermal": "dumpsys thermalservice has no Thermal Status",
                          "battery": "dumpsys battery level: 150 % is outside 0..100 %"}


def test_vcgencmd_that_fails_leaves_a_pi_without_a_temperature_only_if_sysfs_fails_too(board: Path,
                                                                                      tmp_path: Path):
    run = fake_runner({tuple(COMMANDS["measure_temp"]): "VCHI initialization failed\n"})
    assert read_state({"thermal": "sysfs", "vcgencmd": True}, root=str(board), run=run).errors == {}
    state = read_state({"vcgencmd": True}, root=str(tmp_path), run=run)
    assert state.thermal_zones == {} and state.errors == {
        "thermal": "vcgencmd measure_temp printed 'VCHI initialization failed'"}


def test_a_reader_that_raises_is_an_error_not_an_exception(board: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(*args):
        raise RuntimeError("driver gone")

    monkeypatch.setattr(state_module, "read_thermal_zones", broken)
    state = read_state({"thermal": "sysfs", "battery": "sysfs"}, root=str(board))
    assert state.errors == {"thermal": "RuntimeError: driver gone"} and state.battery_capacity == 76


# The [signals] tables of targets/rpi.toml, android.toml and jetson.toml as written there.
PROFILE_TABLES = {
    "rpi": {"files": {"temperature_mC": "/sys/class/thermal/thermal_zone0/temp",
                      "governor": "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"},
            "commands": {"throttled": "vcgencmd get_throttled",
                         "temperature": "vcgencmd measure_temp",
                         "arm_clock": "vcgencmd measure_clock arm"}},
    "android": {"files": {"temperature_mC": "/sys/class/thermal/thermal_zone0/temp"},
                "commands": {"thermal": "dumpsys thermalservice", "headroom": "cmd thermalservice headroom 10",
                             "battery": "dumpsys battery", "cpu_info": "dumpsys cpuinfo"}},
    "jetson": {"files": {"temperature_mC": "/sys/devices/virtual/thermal/thermal_zone0/temp",
                         "power_mode": "/etc/nvpmodel.conf"},
               "commands": {"tegrastats": "tegrastats --interval 500",
                            "power_mode": "nvpmodel -q"}},
}


def test_target_profile_tables_map_onto_signals():
    assert signals_from_profile(PROFILE_TABLES["rpi"]) == {"thermal": "sysfs", "vcgencmd": True}
    assert signals_from_profile(PROFILE_TABLES["android"]) == {"thermal": "dumpsys", "headroom": "cmd",
                                                               "battery": "dumpsys"}
    assert signals_from_profile(PROFILE_TABLES["jetson"]) == {"thermal": "sysfs",
                                                              "tegrastats": True}
    assert signals_from_profile({"thermal": "sysfs"}) == {}


@pytest.mark.parametrize("name, battery", [("rpi", None), ("jetson", None), ("android", "dumpsys")])
def test_shipped_profiles_name_a_battery_only_where_the_device_has_one(name: str, battery):
    """A board on mains names no battery (so it reads as mains); a named battery that fails is unknown."""
    text = (SIGNALS_DIR.parents[2] / "targets" / f"{name}.toml").read_text()
    named = configured(tomllib.loads(text)["signals"])
    assert named.get("battery") == battery and set(named) & {"thermal", "vcgencmd"}
    if name == "rpi":  # a Pi on a UPS HAT: the profile's comment says to uncomment its battery lines
        assert configured(tomllib.loads(text.replace("# battery_", "battery_"))["signals"])["battery"] == "sysfs"


def test_read_state_takes_a_profile_table_as_written(board: Path):
    run = fake_runner({tuple(COMMANDS["get_throttled"]): "throttled=0x8"})
    state = read_state(PROFILE_TABLES["rpi"], root=str(board), run=run)
    assert state.throttling.soft_temp_limit and state.thermal_zones == {"cpu-thermal": pytest.approx(48.312)}
    flat_wins = read_state({**PROFILE_TABLES["rpi"], "vcgencmd": False}, root=str(board),
                           run=fake_runner({}))
    assert flat_wins.throttling is None and flat_wins.max_temp_c == pytest.approx(48.312)


# --- the profile is what is read -------------------------------------------------------------

@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every device file read, in order, at the one function that opens them."""
    paths: list = []
    read_file = _text.read_file

    def record(path, *limit):
        paths.append(Path(path))
        return read_file(path, *limit)

    monkeypatch.setattr(_text, "read_file", record)
    return paths


def profile_signals(text: str) -> dict:
    return tomllib.loads(text)["signals"]


def test_the_temperature_file_the_profile_names_is_the_one_read(board: Path, opened: list):
    rpi = (ROOT / "targets" / "rpi.toml").read_text()
    state = read_state(profile_signals(rpi), root=str(board), run=fake_runner({}))
    assert state.thermal_zones == {"cpu-thermal": pytest.approx(48.312)}  # thermal_zone0, not every zone
    assert [p for p in opened if p.name == "temp"] == [board / TZ / "thermal_zone0/temp"]
    assert not any("thermal_zone1" in str(p) or "thermal_zone10" in str(p) for p in opened)

    gpu = rpi.replace("thermal_zone0/temp", "thermal_zone1/temp")
    assert read_state(profile_signals(gpu), root=str(board), run=fake_runner({})).thermal_zones == {"gpu-thermal": 51.0}

    write_tree(board, {"opt/fan-hat/board_temp": "61500\n"})  # any file, named by a key ending in _mC
    hat = rpi.replace('temperature_mC = "/sys/class/thermal/thermal_zone0/temp"',
                      'board_mC = "/opt/fan-hat/board_temp"')
    state = read_state(profile_signals(hat), root=str(board), run=fake_runner({}))
    assert state.thermal_zones == {"board": 61.5} and state.errors == {}
    (board / "opt/fan-hat/board_temp").unlink()
    gone = read_state({**profile_signals(hat), "vcgencmd": False}, root=str(board))
    assert gone.thermal_zones == {} and "FileNotFoundError" in gone.errors["thermal"]


def test_named_thermal_zones_are_the_only_ones_opened(board: Path, opened: list):
    state = read_state({"thermal": "sysfs", "thermal_zones": ["gpu-thermal"]}, root=str(board))
    assert state.thermal_zones == {"gpu-thermal": 51.0}
    temps = [p for p in opened if p.name == "temp" or p.name.startswith("trip_point")]
    assert temps == [board / TZ / "thermal_zone1/temp"]


def test_the_battery_the_profile_names_is_the_one_read(board: Path):
    write_tree(board, {PS + "ups/type": "Battery\n", PS + "ups/capacity": "33\n", PS + "ups/status": "Charging\n"})
    signals = {"files": {"battery_capacity": "/sys/class/power_supply/BAT0/capacity"}}
    assert read_state(signals, root=str(board)).battery_capacity == 76
    signals["files"]["battery_capacity"] = "/sys/class/power_supply/ups/capacity"
    ups = read_state(signals, root=str(board))
    assert (ups.battery_capacity, ups.charging) == (33, True)
    signals["files"]["battery_capacity"] = "/sys/class/power_supply/none/capacity"
    missing = read_state(signals, root=str(board))
    assert missing.battery_capacity is None
    assert missing.errors["battery"] == f"no battery at {board}/sys/class/power_supply/none"


def test_the_tegrastats_interval_of_the_profile_is_passed_on(tmp_path: Path):
    jetson = (ROOT / "targets" / "jetson.toml").read_text()
    assert 'tegrastats = "tegrastats --interval 500"' in jetson
    for interval in ("500", "2000"):
        run = fake_runner({("sh", "-c", f"tegrastats --interval {interval} | head -n 1"): TEGRA_ORIN_NANO})
        text = jetson.replace("--interval 500", f"--interval {interval}")
        state = read_state(profile_signals(text), root=str(tmp_path), run=run)
        assert state.tegrastats.temps_c["tj"] == 56.7 and "tegrastats" not in state.errors
        assert ("sh", "-c", f"tegrastats --interval {interval} | head -n 1") in run.calls


def test_command_lines_of_the_profile_are_run_as_written():
    rpi = (ROOT / "targets" / "rpi.toml").read_text()
    moved = rpi.replace('"vcgencmd measure_temp"', '"/opt/vc/bin/vcgencmd measure_temp"')
    run = fake_runner({("/opt/vc/bin/vcgencmd", "measure_temp"): "temp=49.1'C\n",
                       ("vcgencmd", "get_throttled"): "throttled=0x0\n"})
    state = read_state({**profile_signals(moved), "thermal": False}, run=run)
    assert state.thermal_zones == {"vcgencmd": 49.1} and state.throttling.raw == 0
    android = {"commands": {"thermal": "dumpsys thermalservice --hal", "battery": "dumpsys battery"}}
    run = fake_runner({("dumpsys", "thermalservice", "--hal"): "Thermal Status: 2\n"})
    assert read_state(android, run=run).android_thermal_status == 2


def test_a_read_that_hangs_is_every_named_signal_failing_and_never_a_second_thread():
    release = threading.Event()
    calls = []

    def hangs(argv):  # a command stuck past any timeout of its own
        calls.append(tuple(argv))
        release.wait()
        return "temp=50.0'C\n" if argv[-1] == "measure_temp" else "level: 80\n"

    read = BoundedReader({"vcgencmd": True, "battery": "dumpsys"}, run=hangs, timeout_s=0.1)
    try:
        for _ in range(5):
            state = within(10, read)
            why = "reading the signals took longer than 0.1 s (a driver or command that does not return)"
            assert state.errors == {"vcgencmd": why, "battery": why} and state.thermal_zones == {}
        assert calls == [("vcgencmd", "measure_temp")]  # one read outstanding, not one per call
    finally:
        release.set()
    within(10, lambda: [t.join() for t in threading.enumerate() if t.name == "hydra-sensors"])
    state = within(10, read)  # the stuck read's late answer is dropped; this is a fresh one
    assert state.thermal_zones == {"vcgencmd": 50.0} and state.battery_capacity == 80 and state.errors == {}


def test_a_bounded_read_still_raises_a_profile_error():
    with pytest.raises(HydraEdgeError, match=r"\[signals\] thermal = 'bogus' is not supported"):
        BoundedReader({"thermal": "bogus"})()


def test_run_command_returns_stdout_or_none():
    assert run_command([sys.executable, "-c", "print('hi')"]) == "hi\n"
    assert run_command([sys.executable, "-c", "import sys; sys.exit(3)"]) is None
    assert run_command(["hydra-edge-no-such-command"]) is None
    assert run_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.2) is None


# --- device info ------------------------------------------------------------------------------

def test_device_info_on_a_raspberry_pi_tree(tmp_path: Path):
    write_tree(tmp_path, {
        "proc/device-tree/model": "Raspberry Pi 4 Model B Rev 1.4\x00",
        "proc/cpuinfo": PI_CPUINFO,
        "proc/sys/kernel/osrelease": "6.6.20+rpt-rpi-v8\n",
        "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"'
                          '\nVERSION_ID="12"\nID=debian\n',
    })
    info = read_device_info(str(tmp_path))
    assert info.model == "Raspberry Pi 4 Model B Rev 1.4"
    assert info.cpu_model == "Cortex-A72"
    assert info.os == "Debian GNU/Linux 12 (bookworm)"
    assert info.kernel == "6.6.20+rpt-rpi-v8"
    assert (info.arch, info.python) == (platform.machine(), platform.python_version())
    assert info.to_dict()["model"] == info.model


def test_device_info_names_big_little_cores_and_x86(tmp_path: Path):
    big_little = "".join(f"processor\t: {i}\nCPU part\t: {'0xd05' if i < 4 else '0xd0b'}\n\n"
                         for i in range(8))
    write_tree(tmp_path / "phone", {"proc/cpuinfo": big_little,
                                    "sys/firmware/devicetree/base/model": "Rockchip RK3588\x00"})
    write_tree(tmp_path / "pc", {"proc/cpuinfo": "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n",
                                 "sys/class/dmi/id/product_name": "Google Compute Engine\n"})
    phone = read_device_info(str(tmp_path / "phone"))
    assert (phone.model, phone.cpu_model) == ("Rockchip RK3588", "Cortex-A55 + Cortex-A76")
    pc = read_device_info(str(tmp_path / "pc"))
    assert (pc.model, pc.cpu_model) == ("Google Compute Engine", "AMD EPYC 7B13")


def test_device_info_reads_the_cpuinfo_of_a_many_core_machine(tmp_path: Path):
    block = "processor\t: {}\nmodel name\t: AMD EPYC 7B13\nflags\t\t: " + "fpu vme de pse tsc msr " * 40 + "\n\n"
    cpuinfo = "".join(block.format(i) for i in range(64))  # ~64 KiB: far more than a sysfs page
    write_tree(tmp_path, {"proc/cpuinfo": cpuinfo})
    assert read_device_info(str(tmp_path)).cpu_model == "AMD EPYC 7B13"


def test_device_info_with_nothing_to_read(tmp_path: Path):
    info = read_device_info(str(tmp_path))
    assert (info.model, info.cpu_model, info.os, info.kernel) == (None, None, None, None)


# --- latency ----------------------------------------------------------------------------------

def test_summarize_latencies_in_ms():
    stats = summarize_latencies([v / 1000 for v in (5, 3, 9, 1, 100, 2, 8, 4, 7, 6)])
    assert stats.count == 10
    assert (stats.min_ms, stats.max_ms) == (pytest.approx(1.0), pytest.approx(100.0))
    assert stats.mean_ms == pytest.approx(14.5)
    assert stats.std_ms == pytest.approx(28.605069, rel=1e-6)
    assert stats.p50_ms == pytest.approx(5.5)
    assert stats.p90_ms == pytest.approx(18.1)
    assert stats.p99_ms == pytest.approx(91.81)
    assert stats.trimmed_mean_ms == pytest.approx(5.5)  # the 1 ms and the 100 ms are cut
    one = summarize_latencies([0.02])
    assert (one.mean_ms, one.p99_ms, one.std_ms, one.trimmed_mean_ms) == (20.0, 20.0, 0.0, 20.0)
    with pytest.raises(ValueError):
        summarize_latencies([])


def test_benchmark_model_output():
    result = parse_benchmark_model(BENCHMARK_MODEL)
    assert result.succeeded and result.tool == "benchmark_model"
    latency = result.latency
    assert latency.count == 50
    assert latency.mean_ms == pytest.approx(23.4567)
    assert (latency.min_ms, latency.max_ms, latency.std_ms) == (
        pytest.approx(22.987), pytest.approx(25.12), pytest.approx(0.412))
    assert latency.p50_ms is None
    assert result.init_ms == pytest.approx(85.123)
    assert result.first_ms == pytest.approx(31.245)
    assert result.warmup_mean_ms == pytest.approx(23.8902)
    assert (result.memory_init_mb, result.memory_overall_mb, result.memory_peak_mb) == (
        pytest.approx(45.2109), pytest.approx(52.8867), pytest.approx(61.3281))
    assert json.loads(json.dumps(result.to_dict()))["latency"]["count"] == 50


def test_benchmark_model_all_same_runs_and_failure():
    same = parse_benchmark_model(
        "Running benchmark for at least 1 iterations\ncount=1 curr=900\n\n"
        "Running benchmark for at least 3 iterations\ncount=3 curr=1000(all same)\n\n"
        "Inference timings in us: Init: 5000, First inference: 900, Warmup (avg): 900, "
        "Inference (avg): 1000\n")
    assert (same.latency.count, same.latency.mean_ms, same.latency.std_ms) == (3, 1.0, 0.0)
    assert same.latency.min_ms == same.latency.max_ms == 1.0
    assert same.memory_peak_mb is None
    failed = parse_benchmark_model("ERROR: Could not open 'missing.tflite'.\n"
                                   "ERROR: Benchmarking failed.\n")
    assert not failed.succeeded and failed.latency is None and failed.init_ms is None


def test_executor_runner_with_iterations():
    result = parse_executor_runner(EXECUTOR_RUNNER)
    assert result.succeeded and result.tool == "executor_runner"
    assert result.init_ms == pytest.approx(80.571)
    assert result.first_ms == pytest.approx(30.702)
    assert result.latency.count == 5
    assert result.latency.mean_ms == pytest.approx(23.7604)
    assert result.latency.p50_ms == pytest.approx(22.1)
    assert result.latency.std_ms == pytest.approx(3.4784986, rel=1e-6)


def test_executor_runner_total_only_old_and_failed():
    total = parse_executor_runner("I 00:00:01.000000 executorch:executor_runner.cpp:310] "
                                  "Model executed successfully 10 time(s) in 250.000000 ms.\n")
    assert (total.latency.count, total.latency.mean_ms, total.latency.p50_ms) == (10, 25.0, None)
    old = parse_executor_runner("I 00:00:00.1 executorch:executor_runner.cpp:200] "
                                "Model executed successfully.\n")
    assert old.succeeded and old.latency is None
    failed = parse_executor_runner("E 00:00:00.000100 executorch:executor_runner.cpp:160] "
                                   "Failed to parse model file missing.pte\n")
    assert not failed.succeeded and failed.latency is None


# --- stays on the device side -----------------------------------------------------------------

def test_signals_import_no_torch_or_numpy():
    code = ("import sys, hydra_edge.runtime.signals, hydra_edge.runtime.latency; "
            "heavy = sorted({'torch', 'numpy'} & set(sys.modules)); "
            "sys.exit(f'imported {heavy}' if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=SIGNALS_DIR.parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr or done.stdout


@pytest.mark.parametrize("source", [*sorted(SIGNALS_DIR.glob("*.py")), SIGNALS_DIR.parent / "latency.py"],
                         ids=lambda p: p.name)
def test_signals_source_parses_as_python_3_9(source: Path):
    ast.parse(source.read_text(), filename=str(source), feature_version=(3, 9))
