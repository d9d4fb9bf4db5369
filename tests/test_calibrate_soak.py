"""Sustained load: duration parsing, the derating tables, and a --soak run on this machine whose
fake sysfs heats up while a fake vcgencmd reports throttling."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from support.bundles import make_bundle
from support.cli import invoke
from support.pythons import torch_free_python
from support.targets import HOST_TARGET

from hydra_edge.errors import HydraEdgeError
from hydra_edge.measure.journal import read_calibration
from hydra_edge.measure.soak import derate, parse_duration

pytestmark = pytest.mark.slow  # converts a bundle and soaks it


@pytest.mark.parametrize("text,seconds", [("10m", 600), ("30s", 30), ("1h", 3600), ("90", 90), ("1m30s", 90),
                                          ("2.5s", 2.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "10x", "0s", "-5m"])
def test_bad_durations_are_one_line(text: str) -> None:
    with pytest.raises(HydraEdgeError, match="duration"):
        parse_duration(text)


def test_derating_is_relative_to_the_coolest_unthrottled_samples() -> None:
    samples = [{"latency_ms": 10.0, "max_temp_c": 41.0, "throttled": False, "android_thermal_status": "NONE"},
               {"latency_ms": 10.0, "max_temp_c": 44.9, "throttled": False, "android_thermal_status": "NONE"},
               {"latency_ms": 12.0, "max_temp_c": 47.0, "throttled": False, "android_thermal_status": "LIGHT"},
               {"latency_ms": 15.0, "max_temp_c": 61.0, "throttled": True, "android_thermal_status": "SEVERE"},
               {"latency_ms": 17.0, "max_temp_c": 63.0, "throttled": True, "android_thermal_status": "SEVERE"},
               {"latency_ms": 9.0, "max_temp_c": None, "throttled": None, "android_thermal_status": None}]
    d = derate(12, 600.0, samples)
    assert d.by_temperature == [(40.0, 1.0), (45.0, 1.2), (60.0, 1.6)]
    assert d.by_thermal_status == {"NONE": 1.0, "LIGHT": 1.2, "SEVERE": 1.6}
    assert d.by_throttled == {"false": 1.0, "true": pytest.approx(16.0 / 10.0)}
    assert derate(3, 1.0, samples[3:5]).by_throttled == {}  # no unthrottled baseline: no table
    with pytest.raises(HydraEdgeError, match="no samples"):
        derate(3, 1.0, [])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("onnx"), HOST_TARGET, "3,12")


def test_soak_on_a_heating_board_gives_a_derating_curve(bundle: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "board"  # the board's /sys, read by the runner through --sysfs-root
    zone = root / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("40000\n")
    bin_dir = tmp_path / "bin"  # vcgencmd says "throttled now" once the zone passes 60 °C
    bin_dir.mkdir()
    (bin_dir / "vcgencmd").write_text(
        f"#!/bin/sh\nt=$(cat '{zone / 'temp'}')\n"
        'case "$1" in get_throttled) [ "$t" -ge 60000 ] && echo throttled=0x50004 || echo throttled=0x0 ;;\n'
        "  measure_temp) echo \"temp=$((t / 1000)).0'C\" ;;\nesac\n")
    (bin_dir / "vcgencmd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    stop = threading.Event()

    out = tmp_path / "cal.json"

    def heat() -> None:
        """From the soak on: the rounds before it wait for the board to be back at its start temperature."""
        while not stop.wait(0.05):
            if out.exists() and len(read_calibration(out).measured()) == 2:
                break
        temp = 40000
        while not stop.wait(0.1):
            temp = min(temp + 1500, 80000)
            (zone / "temp.new").write_text(f"{temp}\n")
            (zone / "temp.new").replace(zone / "temp")

    heater = threading.Thread(target=heat)
    heater.start()
    try:
        result = invoke("--bundle", bundle, "--local", "--python", torch_free_python(tmp_path), "--out",
                        out, "--runs", 5, "--soak", "3s", "--soak-interval", "0.25",
                        "--sysfs-root", root)
    finally:
        stop.set()
        heater.join()
    assert result.exit_code == 0, result.output
    soak = read_calibration(tmp_path / "cal.json").soak
    assert soak is not None and soak.heads == 12 and soak.duration_s == 3.0 and len(soak.samples) >= 6
    temps = [s["max_temp_c"] for s in soak.samples]
    assert temps == sorted(temps) and temps[-1] > temps[0]  # read live from the heating board
    bins = [low for low, _ in soak.by_temperature]
    assert len(bins) >= 3 and bins == sorted(bins) and soak.by_temperature[0][1] == 1.0
    assert all(m > 0 for _, m in soak.by_temperature) and all(s["latency_ms"] > 0 for s in soak.samples)
    assert set(soak.by_throttled) == {"false", "true"} and soak.by_throttled["false"] == 1.0
    assert "soak (12 heads, 3 s)" in result.output
