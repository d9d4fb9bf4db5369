"""The on-device switcher on a real (tiny, ONNX) bundle and a fake sysfs tree changed while it runs."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from hydra_edge.config import preset
from hydra_edge.convert import pipeline
from hydra_edge.lut.command import make_lut
from hydra_edge.model import HydraViT
from hydra_edge.runtime.engines import load
from hydra_edge.runtime.switcher import Switcher
from test_lut import calibration

# sysfs paths, so signals_from_profile reads thermal and battery from sysfs
PROFILE = ('name = "host"\nthreads = 1\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\nruntime = "onnxruntime"\n'
           'runtime_min_version = "1.17"\n[signals.files]\ntemperature_mC = "/sys/class/thermal/thermal_zone0/temp"\n'
           'battery = "/sys/class/power_supply/BAT0/capacity"\n')
# bands <60, 60-70, 70-80, >=80 °C pick 12, 9, 6, 3 heads on mains (latency 10/20/30/40 ms, budget 41 ms)
POLICY = "[thermal]\nderating = [1.0, 1.3, 1.9, 3.5]\n"
IMAGE = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight depth-1 digits model converted to ONNX for 3, 6, 9, 12 heads, with its lut.json."""
    root = tmp_path_factory.mktemp("switcher")
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=1, heads=(3, 6, 9, 12))).save(root / "m.pt")
    (root / "host.toml").write_text(PROFILE)
    out = root / "bundle"
    pipeline.convert(pipeline.ConvertOptions(checkpoint=root / "m.pt", target=str(root / "host.toml"), out=out))
    calibration(out, {3: 10, 6: 20, 9: 30, 12: 40}).write(root / "cal.json")
    (root / "policy.toml").write_text(POLICY)
    make_lut(out, root / "cal.json", out, budget_ms=41, policy=root / "policy.toml")
    return out


class Board:
    """A fake sysfs tree: one thermal zone and the battery the profile names (full: the same bands as mains)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        zone = root / "sys/class/thermal/thermal_zone0"
        zone.mkdir(parents=True)
        (zone / "type").write_text("cpu-thermal\n")
        self.temp(40)
        self.battery(100, "Full")

    def temp(self, c: float) -> None:
        (self.root / "sys/class/thermal/thermal_zone0/temp").write_text(f"{int(c * 1000)}\n")

    def battery(self, pct: int, status: str = "Discharging") -> None:
        bat = self.root / "sys/class/power_supply/BAT0"
        bat.mkdir(parents=True, exist_ok=True)
        for name, value in (("type", "Battery"), ("capacity", pct), ("status", status)):
            (bat / name).write_text(f"{value}\n")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def board(tmp_path: Path) -> Board:
    return Board(tmp_path / "board")


def switcher(bundle: Path, board: Board, **kw) -> Switcher:
    return Switcher(bundle, root=str(board.root), **kw)


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for the background thread (a generous bound for a loaded machine, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the switcher did not switch"
        time.sleep(0.005)


def test_switches_within_one_poll_period_while_running(bundle: Path, board: Board) -> None:
    with switcher(bundle, board, poll_s=0.02) as sw:
        sw.start()
        assert sw.heads == 12 and sw.predict(IMAGE).heads == 12
        for temp, heads in ((75, 6), (95, 3)):
            board.temp(temp)
            polls_at_change = sw.polls  # polls started before the change: at most this many
            wait_for(lambda: sw.heads == heads)
            assert sw.events[-1].poll <= polls_at_change + 1 and sw.events[-1].reason == "state"
            assert sw.predict(IMAGE).heads == heads
    assert [(e.from_heads, e.to_heads) for e in sw.events] == [(None, 12), (12, 6), (6, 3)]


def test_never_flaps_inside_the_margin_and_waits_out_the_dwell(bundle: Path, board: Board) -> None:
    clock = Clock()
    with switcher(bundle, board, clock=clock, prefetch=False) as sw:
        board.temp(69)
        assert sw.poll() == 9
        for temp in [71, 68, 72, 67.5, 70.5, 69, 71.9, 67.1] * 5:  # around the 70 °C edge, inside 3 °C
            clock.now += 60  # far past the dwell: only the margin holds it
            board.temp(temp)
            sw.poll()
        assert [(e.from_heads, e.to_heads) for e in sw.events] == [(None, 9), (9, 6)]
        board.temp(85)  # worse: at once
        clock.now += 60
        assert sw.poll() == 3
        board.temp(62)  # 3 °C clear of the 70 °C edge: better, but only after the dwell
        clock.now += 1
        assert sw.poll() == 3
        clock.now += sw.table.min_dwell_s
        assert sw.poll() == 3  # the table asks for 9 now: granted once that has persisted raise_after_s
        clock.now += sw.settings.raise_after_s - 1
        assert sw.poll() == 3
        clock.now += 1
        assert sw.poll() == 9


def test_battery_bands_and_charging(bundle: Path, board: Board) -> None:
    clock = Clock()
    board.battery(80)
    with switcher(bundle, board, clock=clock) as sw:
        assert sw.poll() == 12
        board.battery(15)  # budget x 0.5: 20.5 ms
        assert sw.poll() == 6
        board.battery(15, "Charging")
        clock.now += 10
        assert sw.poll() == 6  # more heads only once charging has persisted raise_after_s
        clock.now += sw.settings.raise_after_s
        assert sw.poll() == 12
        assert sw.events[-1].reading.charging and sw.events[-1].reading.battery_pct == 15


def test_throttled_pi_counts_as_hot(bundle: Path, board: Board) -> None:
    answers = {("vcgencmd", "measure_temp"): "temp=50.0'C\n", ("vcgencmd", "get_throttled"): "throttled=0x4\n"}
    with switcher(bundle, board, signals={"vcgencmd": True}, run=lambda argv: answers.get(tuple(argv))) as sw:
        assert sw.poll() == 3 and sw.events[-1].reading.thermal == 80.0


def test_predict_is_the_artefact_and_neighbours_are_prefetched(bundle: Path, board: Board) -> None:
    with switcher(bundle, board) as sw:
        out = sw.predict(IMAGE[0])
        expected = load(bundle / sw.table.candidate(12).file).run(IMAGE)
        assert out.heads == 12 and np.array_equal(out.logits, expected)
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [9, 12]
        board.temp(75)
        sw.poll()
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [9, 12]  # 6 loads when first used, its neighbours after that
        assert sw.predict(IMAGE).heads == 6
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [3, 6, 9]  # least recently used (12) dropped: cache of 3
    with switcher(bundle, board, prefetch=False, cache_size=1) as sw:
        sw.predict(IMAGE)
        assert sw.cached() == [6]
    json.dumps(sw.event_log())


@pytest.mark.parametrize("damage", ["other-bundle", "truncated", "unknown-schema", "missing"])
def test_bad_lut_falls_back_to_the_smallest_head_count(bundle: Path, board: Board, tmp_path: Path,
                                                       damage: str, caplog: pytest.LogCaptureFixture) -> None:
    text = (bundle / "lut.json").read_text()
    doc = json.loads(text)
    bad = tmp_path / "lut.json"
    if damage == "other-bundle":
        doc["bundle"]["manifest_sha256"] = "f" * 64
        bad.write_text(json.dumps(doc))
    elif damage == "truncated":
        bad.write_text(text[: len(text) // 2])
    elif damage == "unknown-schema":
        bad.write_text(json.dumps({**doc, "schema_version": 99}))
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"):
        with switcher(bundle, board, lut=bad) as sw:
            assert sw.predict(IMAGE).heads == 3
            board.temp(20)
            assert sw.poll() == 3
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "\n" not in warning.getMessage() and "smallest head count (3)" in warning.getMessage()
    assert sw.events[0].reason.startswith("fallback: ")


def test_an_artefact_that_will_not_load_is_not_retried(bundle: Path, board: Board, tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    (broken / "vit_h12_onnx_fp32.onnx").write_bytes(b"not a model")  # sha256 no longer matches the table
    clock = Clock()
    with Switcher(broken, root=str(board.root), clock=clock, prefetch=False) as sw:
        assert sw.poll() == 12
        assert sw.predict(IMAGE).heads == 3  # the fastest instead, with the reason logged
        assert sw.events[-1].reason.startswith("load failed") and "sha256" in sw.events[-1].reason
        for _ in range(5):
            clock.now += 60  # long past the dwell: 12 is still what the table says
            assert sw.poll() == 3 and sw.predict(IMAGE).heads == 3
        assert len(sw.events) == 2
