"""The on-device switcher on a real (tiny, ONNX) bundle and a fake sysfs tree changed while it runs,
sensors that fail or flap included (on a fake clock)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Set

import numpy as np
import pytest
import torch
from support.bounded import within
from support.switcher import IMAGE, POLICY, Board, Clock, write
from support.tables import ANDROID_SIGNALS, PHONE_SIGNALS, calibration, table
from support.targets import SYSFS_TARGET

from hydra_edge.convert import pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.errors import HydraEdgeError
from hydra_edge.lut.make import make_lut
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.records.calibration import Derating
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime import rebuild as rebuild_module
from hydra_edge.runtime.engines import load, load_bytes
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.signals import _text
from hydra_edge.runtime.switcher import Switcher

pytestmark = pytest.mark.slow  # converts a bundle (full and compact) for the switcher to load


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight depth-1 digits model converted to ONNX for 3, 6, 9, 12 heads (a file each), with its lut.json."""
    root = tmp_path_factory.mktemp("switcher")
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=1, heads=(3, 6, 9, 12))).save(root / "m.pt")
    (root / "host.toml").write_text(SYSFS_TARGET)
    out = root / "bundle"
    pipeline.convert(ConvertOptions(checkpoint=root / "m.pt", target=str(root / "host.toml"), out=out,
                                    layout="full"))
    calibration(out, {3: 10, 6: 20, 9: 30, 12: 40}).write(root / "cal.json")
    (root / "policy.toml").write_text(POLICY)
    make_lut(out, root / "cal.json", out, budget_ms=41, policy=root / "policy.toml")
    return out


@pytest.fixture(scope="module")
def compact_bundle(bundle: Path) -> Path:
    """The same model and table as ``bundle``, converted compact: 12 heads whole, 3, 6 and 9 rebuilt."""
    root = bundle.parent
    out = root / "compact"
    pipeline.convert(ConvertOptions(checkpoint=root / "m.pt", target=str(root / "host.toml"), out=out,
                                    layout="compact"))
    calibration(out, {3: 10, 6: 20, 9: 30, 12: 40}).write(root / "compact-cal.json")
    make_lut(out, root / "compact-cal.json", out, budget_ms=41, policy=root / "policy.toml")
    assert [a.compact is not None for a in read_manifest(out).artefacts] == [True, True, True, False]
    return out


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
            polls_at_change = sw.polls  # polls counted before the change; one more may have read before it
            wait_for(lambda: sw.heads == heads)
            assert sw.events[-1].poll <= polls_at_change + 2 and sw.events[-1].reason == "state"
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
        assert sorted(sw.cached()) == [3, 6, 9]  # 12 is no neighbour of 6: dropped
    with switcher(bundle, board, prefetch=False, cache_size=1) as sw:
        sw.predict(IMAGE)
        assert sw.cached() == [6]
    json.dumps(sw.event_log())


@pytest.fixture
def rebuilds(monkeypatch: pytest.MonkeyPatch) -> list:
    """(head count, thread) of every rebuild a compact bundle's load does, in order."""
    done: list = []
    real = rebuild_module.rebuild

    def spy(bundle: Path, record):  # noqa: ANN001, ANN202 - rebuild's own signature
        done.append((record.heads, threading.current_thread().name))
        return real(bundle, record)

    monkeypatch.setattr(rebuild_module, "rebuild", spy)
    return done


def expected(bundle: Path, heads: int) -> np.ndarray:
    record = next(a for a in read_manifest(bundle).artefacts if a.heads == heads)
    return load_bytes(rebuild_module.rebuild(bundle, record), record.file).run(IMAGE)


def test_the_neighbours_are_rebuilt_before_a_switch_needs_them(compact_bundle: Path, board: Board,
                                                               rebuilds: list) -> None:
    with switcher(compact_bundle, board) as sw:
        assert sw.predict(IMAGE).heads == 12  # the largest: its file, nothing rebuilt
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [9, 12] and rebuilds == [(9, "hydra-prefetch_0")]
        board.temp(65)  # 9 heads: a neighbour, already rebuilt and loaded
        assert sw.poll() == 9
        out = sw.predict(IMAGE)
        assert out.heads == 9 and rebuilds == [(9, "hydra-prefetch_0")]  # the switch rebuilt nothing
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [6, 9, 12] and rebuilds[1:] == [(6, "hydra-prefetch_0")]
        board.temp(95)  # 3 heads: not a neighbour of 9, so the switch rebuilds it on the spot, and still works
        assert sw.poll() == 3
        missed = sw.predict(IMAGE)
        assert missed.heads == 3 and rebuilds[2:] == [(3, threading.current_thread().name)]
        sw.wait_prefetch()
        assert sorted(sw.cached()) == [3, 6] and len(rebuilds) == 3  # 9 and 12 dropped: at most the neighbours
    released = [name for name in (t.name for t in threading.enumerate()) if name.startswith("hydra-prefetch")]
    assert released == []  # closing the switcher stops its prefetch thread
    # the rebuilt engines compute what the verified artefacts compute
    assert np.array_equal(out.logits, expected(compact_bundle, 9))
    assert np.array_equal(missed.logits, expected(compact_bundle, 3))


def test_a_tampered_neighbour_is_refused_on_prefetch_and_the_current_model_runs_on(
        compact_bundle: Path, board: Board, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(compact_bundle, bundle)
    *_, h9, h12 = read_manifest(bundle).artefacts
    recipe = bundle / h9.compact.recipe
    recipe.write_text(recipe.read_text().replace('"offset":', '"offset": ', 1))  # same recipe, other bytes
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), switcher(bundle, board) as sw:
        assert sw.predict(IMAGE).heads == 12
        sw.wait_prefetch()
        assert sw.cached() == [12]
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.startswith(f"cannot prefetch 9 heads (12 heads run on): {recipe}: recipe sha256 is ")
        assert "\n" not in warning
        out = sw.predict(IMAGE)
        assert out.heads == 12 and np.array_equal(out.logits, load(bundle / h12.file).run(IMAGE))
        board.temp(65)  # the table picks 9: the switch tries it again, refuses it, runs the fastest
        assert sw.poll() == 9 and sw.predict(IMAGE).heads == 3
        assert sw.events[-1].reason.startswith(f"load failed: {recipe}: recipe sha256 is ")


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


@pytest.mark.parametrize("lut", ["stale lut.json", "no lut.json"])
def test_a_bundle_without_artefacts_is_one_line_not_a_crash(bundle: Path, board: Board, tmp_path: Path,
                                                            lut: str) -> None:
    empty = tmp_path / "bundle"
    shutil.copytree(bundle, empty)
    manifest = read_manifest(empty)
    manifest.artefacts = []  # what convert leaves when it is killed before its first artefact
    manifest.write(empty)
    if lut == "no lut.json":
        (empty / "lut.json").unlink()
    with pytest.raises(HydraEdgeError) as raised:
        switcher(empty, board)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{empty / 'manifest.json'} lists no artefacts") and "hydra-edge convert" in message


def test_an_artefact_that_will_not_load_is_not_retried(bundle: Path, board: Board, tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    (broken / "vit_h12_onnx_fp32.onnx").write_bytes(b"not a model")  # sha256 no longer matches the table
    clock = Clock()
    with Switcher(broken, root=str(board.root), clock=clock, prefetch=False) as sw:
        assert sw.poll() == 12
        assert sw.predict(IMAGE).heads == 3  # the fastest instead, with the reason logged
        assert sw.events[-1].reason.startswith("load failed") and "sha256" in sw.events[-1].reason
        clock.now += 60  # long past the dwell: 12 is still what the table says, 9 the most that loads
        assert sw.poll() == 3  # a rise: granted once the table has asked for it raise_after_s
        for _ in range(5):
            clock.now += 60
            assert sw.poll() == 9 and sw.predict(IMAGE).heads == 9
        assert [e.to_heads for e in sw.events] == [12, 3, 9]


def test_after_a_failed_load_the_switcher_never_runs_more_heads_than_the_table_allows(bundle: Path, board: Board,
                                                                                      tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    h6 = broken / "vit_h6_onnx_fp32.onnx"
    data = bytearray(h6.read_bytes())
    data[len(data) // 2] ^= 1  # one byte flipped: its sha256 no longer matches
    h6.write_bytes(bytes(data))
    clock = Clock()
    with Switcher(broken, root=str(board.root), clock=clock, prefetch=False) as sw:
        board.temp(75)  # the table says 6: it will not load, so 3 runs
        assert sw.poll() == 6 and sw.predict(IMAGE).heads == 3
        board.temp(40)
        clock.now += 20
        assert sw.poll() == 3
        clock.now += sw.settings.raise_after_s
        assert sw.poll() == 12 and sw.predict(IMAGE).heads == 12
        board.temp(75)  # the table says 6 again: the largest loadable count no larger than 6 is 3, not 12
        for _ in range(40):
            clock.now += 1
            assert sw.poll() == 3 and sw.predict(IMAGE).heads == 3
        board.temp(65)  # the table says 9: loadable, and no more than it allows
        clock.now += sw.settings.raise_after_s + 1
        sw.poll()
        clock.now += sw.settings.raise_after_s
        assert sw.poll() == 9 and sw.predict(IMAGE).heads == 9


# --- failing sensors --------------------------------------------------------------------------
# With the table above: 12 heads below 60 °C, 9 below 70, 6 below 80, 3 from 80 °C on mains or a
# battery >= 50 %; in the lowest battery band (< 20 %) 6 heads at most.

@pytest.fixture
def denied(monkeypatch: pytest.MonkeyPatch) -> Set[Path]:
    """Paths whose read fails with EACCES, at the one function that opens sysfs files (tests run as
    root, where chmod 000 denies nothing)."""
    paths: Set[Path] = set()
    read_file = _text.read_file

    def deny(path: "str | Path", *limit: int) -> str:
        if Path(path) in paths:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return read_file(path, *limit)

    monkeypatch.setattr(_text, "read_file", deny)
    return paths


# What a broken sensor file holds: garbage, nothing, NaN, absurd values (1e9 m°C), or it will not read.
BAD = ["garbage\n", "", "nan\n", "1000000000\n", "-300000\n", "directory", "dangling", "EACCES"]


def spoil(path: Path, bad: str, denied: Set[Path]) -> None:
    if bad == "EACCES":
        denied.add(path)
    else:
        write(path, bad)


@pytest.mark.parametrize("bad", BAD)
def test_a_failed_temperature_holds_the_last_reading_then_runs_as_hottest(bundle: Path, board: Board, bad: str,
                                                                       denied: Set[Path]) -> None:
    clock = Clock()
    board.temp(65)
    with switcher(bundle, board, clock=clock, prefetch=False) as sw:
        assert sw.poll() == 9
        spoil(board.temp_file, bad, denied)
        for _ in range(29):  # far past the dwell, but the last good reading is < 30 s old: held
            clock.now += 1
            assert sw.poll() == 9
        clock.now += 1
        assert sw.poll() == 3  # stale: the hottest band, never the coolest
        event = sw.event_log()[-1]
        assert event["reason"] == "state: thermal sensor cpu-thermal unknown since 30 s"
        assert math.isnan(event["reading"]["thermal"])
        json.dumps(sw.event_log())
        for _ in range(120):
            clock.now += 1
            assert sw.poll() == 3


class Stuck:
    """Paths whose read blocks (as a sysfs read can, inside a driver) until ``release`` is set."""

    def __init__(self) -> None:
        self.paths: Set[Path] = set()
        self.release = threading.Event()


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch):
    """Blocks reads of ``stuck.paths`` at the one function that opens sysfs files, until the test ends."""
    blocked = Stuck()
    read_file = _text.read_file

    def block(path: "str | Path", *limit: int) -> str:
        if Path(path) in blocked.paths:
            blocked.release.wait()
        return read_file(path, *limit)

    monkeypatch.setattr(_text, "read_file", block)
    yield blocked
    blocked.release.set()


def sensor_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "hydra-sensors"]


def test_a_sensor_read_that_never_returns_is_a_failed_sensor_and_the_switcher_polls_on(
        bundle: Path, board: Board, stuck: Stuck, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    board.temp(65)
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), \
            switcher(bundle, board, clock=clock, prefetch=False, read_timeout_s=0.2) as sw:
        assert sw.poll() == 9
        stuck.paths.add(board.temp_file)
        for _ in range(29):  # every poll returns; the last good readings are held
            clock.now += 1
            assert within(10, sw.poll) == 9
        clock.now += 1
        assert within(10, sw.poll) == 3  # stale: the hottest band and the lowest battery band
        assert sw.events[-1].reason == ("state: thermal sensor cpu-thermal unknown since 30 s, "
                                        "battery unknown since 30 s")
        assert len(sensor_threads()) == 1  # one read outstanding, however many polls
        assert "took longer than 0.2 s" in caplog.records[0].getMessage()
        stuck.release.set()
        wait_for(lambda: not sensor_threads())
        board.temp(40)
        clock.now += sw.table.min_dwell_s
        assert sw.poll() == 3  # read again: more heads once that has persisted
        clock.now += sw.settings.raise_after_s
        assert sw.poll() == 12 and sw.events[-1].reading.thermal == 40.0


@pytest.mark.parametrize("where", ["temp", "trip_point_0_temp"])
def test_a_fifo_in_a_thermal_zone_never_stops_a_running_switcher(bundle: Path, board: Board, where: str) -> None:
    board.temp(40)
    fifo = board.temp_file.with_name(where)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    board.gpu(40)
    try:
        with switcher(bundle, board, poll_s=0.02, signals={"thermal": "sysfs"}) as sw:
            within(10, sw.start)
            board.gpu(95)
            wait_for(lambda: sw.heads == 3)
    finally:  # a reader the old code left blocked on the FIFO gets end-of-file
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# Two named sensors, as a profile names them: temperature files, or thermal zones by type (on mains).
TWO_SENSORS = {
    "files": {"files": {"cpu_mC": "/sys/class/thermal/thermal_zone0/temp",
                        "gpu_mC": "/sys/class/thermal/thermal_zone1/temp"}},
    "thermal_zones": {"thermal": "sysfs", "thermal_zones": ["cpu-thermal", "gpu-thermal"]},
}


# Which of the two sensors fails (and is the hot one): the first read, or the last. The hottest of several
# must treat an unknown one as hottest wherever it comes: max() over [40, nan] is 40, over [nan, 40] nan.
FAILING = {"first": ("cpu-thermal", "thermal_zone0"), "last": ("gpu-thermal", "thermal_zone1")}


@pytest.mark.parametrize("failing", sorted(FAILING))
@pytest.mark.parametrize("bad", ["garbage\n", ""])
@pytest.mark.parametrize("named", sorted(TWO_SENSORS))
def test_a_failed_sensor_among_several_is_held_then_hottest_and_the_cooler_one_never_stands_in(
        bundle: Path, board: Board, named: str, bad: str, failing: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    name, zone = FAILING[failing]
    hot, cool = (board.temp, board.gpu) if failing == "first" else (board.gpu, board.temp)
    hot_file = board.temp_file if failing == "first" else board.gpu_file
    hot(65)  # the failing sensor: 9 heads
    cool(40)  # 12 heads, were it the only sensor
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), \
            switcher(bundle, board, clock=clock, prefetch=False, signals=TWO_SENSORS[named]) as sw:
        assert sw.poll() == 9 and sw.events[0].reading.thermal == 65.0
        write(hot_file, bad)
        for _ in range(29):  # far past dwell and raise_after_s: the failing one's 65 °C is held, not the other's 40
            clock.now += 1
            assert sw.poll() == 9
        clock.now += 1
        assert sw.poll() == 3  # stale: the hottest band, as a lone sensor
        event = sw.events[-1]
        assert event.reason == f"state: thermal sensor {name} unknown since 30 s"
        assert math.isnan(event.reading.thermal)
        for _ in range(120):
            clock.now += 1
            assert sw.poll() == 3
        hot(40)  # both cool: more heads once that has persisted
        clock.now += 1
        assert sw.poll() == 3
        clock.now += sw.settings.raise_after_s
        assert sw.poll() == 12 and sw.events[-1].reason == "state" and sw.events[-1].reading.thermal == 40.0
    failed, recovered = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert failed.startswith(f"thermal sensor {name} unreadable ({zone}: ")
    assert failed.endswith(" — holding the last reading 65.0 °C for up to 30 s")
    assert recovered == f"thermal sensor {name} readable again (40.0 °C) after 160 s with 150 failed reads"


@pytest.mark.parametrize("named", sorted(TWO_SENSORS))
def test_a_named_sensor_that_never_reads_is_the_hottest_band_from_the_start(bundle: Path, board: Board,
                                                                          named: str) -> None:
    board.gpu(40)
    write(board.temp_file, "garbage\n")
    with switcher(bundle, board, signals=TWO_SENSORS[named]) as sw:
        assert sw.poll() == 3 and sw.events[0].reason == "start: thermal sensor cpu-thermal unknown since 0 s"


def test_a_named_thermal_zone_that_is_gone_is_the_hottest_band(bundle: Path, board: Board) -> None:
    clock = Clock()
    board.gpu(40)
    with switcher(bundle, board, clock=clock, signals=TWO_SENSORS["thermal_zones"]) as sw:
        assert sw.poll() == 12
        shutil.rmtree(board.gpu_file.parent)
        clock.now += sw.settings.stale_after_s
        assert sw.poll() == 3 and sw.events[-1].reason == "state: thermal sensor gpu-thermal unknown since 30 s"


@pytest.mark.parametrize("fails", ["garbage", "zone gone"])
def test_reading_every_zone_a_zone_that_read_then_fails_counts_one_that_never_read_does_not(
        bundle: Path, board: Board, fails: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    board.temp(65)
    board.gpu(40)
    disabled = board.root / "sys/class/thermal/thermal_zone2"  # a zone whose sensor is off: it never reads
    disabled.mkdir()
    (disabled / "type").write_text("soc-thermal\n")
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), \
            switcher(bundle, board, clock=clock, signals={"thermal": "sysfs"}) as sw:
        assert sw.poll() == 9
        if fails == "garbage":
            write(board.temp_file, "garbage\n")
        else:
            shutil.rmtree(board.temp_file.parent)
        clock.now += sw.settings.stale_after_s
        assert sw.poll() == 3 and sw.events[-1].reason == "state: thermal sensor cpu-thermal unknown since 30 s"
    (warning,) = [r.getMessage() for r in caplog.records]
    why = "not found by this read" if fails == "zone gone" else "thermal_zone0: "
    assert warning.startswith(f"thermal sensor cpu-thermal unreadable ({why}")


def test_a_temperature_unreadable_from_the_start_is_the_hottest_band(bundle: Path, board: Board) -> None:
    write(board.temp_file, "garbage\n")
    with switcher(bundle, board) as sw:
        assert sw.poll() == 3 and sw.events[0].reason == "start: thermal sensor cpu-thermal unknown since 0 s"


def test_a_profile_without_a_thermal_signal_runs_as_hottest_and_says_so(bundle: Path, board: Board,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), \
            switcher(bundle, board, signals={"battery": "none"}) as sw:
        assert sw.poll() == 3 and sw.poll() == 3
    assert [r.getMessage() for r in caplog.records] == [
        "thermal unreadable (the profile names no thermal signal) — no recent reading; assuming the hottest band"]


def test_assumed_hot_replaces_the_hottest_band(bundle: Path, board: Board) -> None:
    clock = Clock()
    signals = {"thermal": "sysfs", "battery": "sysfs", "assumed_hot": 75.0, "stale_after_s": 5}
    with switcher(bundle, board, clock=clock, signals=signals) as sw:
        assert sw.poll() == 12
        write(board.temp_file, "directory")
        clock.now += 4
        assert sw.poll() == 12
        clock.now += 1
        assert sw.poll() == 6 and sw.events[-1].reading.thermal == 75.0


@pytest.mark.parametrize("bad", [*BAD[:2], "-5\n", "250\n", "76.5.1\n", "directory", "EACCES", "missing file",
                                 "no supply"])
def test_a_failed_battery_is_the_lowest_band_not_mains(bundle: Path, board: Board, bad: str,
                                                         denied: Set[Path]) -> None:
    board.battery(90, "Charging")  # charging says nothing once the level cannot be read
    if bad == "missing file":
        board.capacity_file.unlink()
    elif bad == "no supply":
        board.no_battery()
    else:
        spoil(board.capacity_file, bad, denied)
    with switcher(bundle, board) as sw:
        assert sw.poll() == 6  # 12 on mains
        assert math.isnan(sw.events[0].reading.battery_pct)
        assert sw.events[0].reason == "start: battery unknown since 0 s"


def test_a_failed_battery_holds_its_last_level_first(bundle: Path, board: Board) -> None:
    clock = Clock()
    board.battery(80)
    with switcher(bundle, board, clock=clock) as sw:
        assert sw.poll() == 12
        write(board.capacity_file, "-1\n")
        clock.now += 29
        assert sw.poll() == 12
        clock.now += 1
        assert sw.poll() == 6 and sw.events[-1].reason == "state: battery unknown since 30 s"


@pytest.mark.parametrize("key, value", [("stale_after_s", "soon"), ("raise_after_s", -1), ("assumed_hot", math.inf),
                                        ("stale_after_s", True)])
def test_a_bad_fail_safe_setting_is_one_line(bundle: Path, board: Board, key: str, value: object) -> None:
    one_line = rf"^the switcher's signals: \$\.{key}: .*(expected|not a finite number).*; see targets/rpi\.toml for the format$"
    with pytest.raises(HydraEdgeError, match=one_line):
        switcher(bundle, board, signals={"thermal": "sysfs", key: value})


def test_a_board_that_declares_no_battery_runs_on_mains(bundle: Path, board: Board) -> None:
    board.no_battery()
    with switcher(bundle, board, signals={"thermal": "sysfs", "battery": "none"}) as sw:
        assert sw.poll() == 12 and sw.events[0].reading.battery_pct == -1 and sw.events[0].reason == "start"


def test_both_sensors_unreadable_run_the_smallest_head_count(bundle: Path, board: Board, denied: Set[Path]) -> None:
    clock = Clock()
    denied.update({board.temp_file, board.capacity_file})
    with switcher(bundle, board, clock=clock) as sw:
        for _ in range(600):
            assert sw.poll() == 3 == sw.table.heads[0]
            clock.now += 1
        assert sw.events[0].reason == "start: thermal sensor cpu-thermal unknown since 0 s, battery unknown since 0 s"


def test_a_cool_down_raises_heads_only_after_raise_after_s_and_heating_lowers_at_once(bundle: Path,
                                                                                    board: Board) -> None:
    clock = Clock()
    board.temp(85)
    with switcher(bundle, board, clock=clock) as sw:
        assert sw.poll() == 3 and sw.settings.raise_after_s == 10 and sw.table.min_dwell_s == 5
        board.temp(40)
        for _ in range(14):  # the dwell (5 s), then 10 s in which the table asks for 12 without a break
            clock.now += 1
            assert sw.poll() == 3
        clock.now += 1
        assert sw.poll() == 12
        board.temp(75)
        clock.now += 1
        assert sw.poll() == 6
        board.temp(40)  # cool again, but one hot reading inside the wait starts it over
        for temp in [40] * 8 + [75] + [40] * 10:
            board.temp(temp)
            clock.now += 1
            assert sw.poll() == 6
        clock.now += 1
        assert sw.poll() == 12


def _polls(board: Board, pattern: str) -> list:
    """What the sensor file holds at each of 600 polls (10 minutes at 1 s)."""
    if pattern == "bad every other poll":
        return ["75000\n", "garbage\n"] * 300
    if pattern == "unreadable every other poll":
        return ["75000\n", "directory"] * 300
    if pattern == "noisy across two edges":
        return ["65000\n", "85000\n"] * 300
    return (["dangling"] * 40 + ["40000\n"] * 5) * 14  # long outages with short good spells


@pytest.mark.parametrize("pattern", ["bad every other poll", "unreadable every other poll", "noisy across two edges",
                                     "long outages"])
def test_a_flapping_sensor_makes_at_most_a_few_switches_a_minute(bundle: Path, board: Board, pattern: str) -> None:
    clock = Clock()
    with switcher(bundle, board, clock=clock, prefetch=False) as sw:
        start = clock.now
        for text in _polls(board, pattern):
            write(board.temp_file, text)
            sw.poll()
            clock.now += 1
        switches = [e for e in sw.events if e.from_heads is not None]
        per_minute = [len(list(group)) for _, group in itertools.groupby(switches, lambda e: (e.time - start) // 60)]
        assert max(per_minute, default=0) <= 3, per_minute
        assert len(switches) <= 3  # in fact: it settles on the heads its worst reading allows


def test_one_warning_when_a_sensor_fails_and_one_when_it_recovers(bundle: Path, board: Board, denied: Set[Path],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()

    def warnings() -> list:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), \
            switcher(bundle, board, clock=clock, prefetch=False) as sw:
        sw.poll()
        denied.add(board.temp_file)
        for _ in range(60):  # a minute unreadable, long past stale: one warning
            clock.now += 1
            sw.poll()
        assert warnings() == [f"thermal sensor cpu-thermal unreadable (thermal_zone0: PermissionError: [Errno 13] "
                              f"Permission denied: "
                              f"'{board.temp_file}') — holding the last reading 40.0 °C for up to 30 s"]
        for i in range(40):  # readable and not by turns: the same failure, no message per poll
            (denied.add if i % 2 else denied.discard)(board.temp_file)
            clock.now += 1
            sw.poll()
        assert len(warnings()) == 1
        denied.clear()
        for _ in range(10):  # readable again, but not yet for raise_after_s
            clock.now += 1
            sw.poll()
        assert len(warnings()) == 1
        clock.now += 1
        sw.poll()
        assert warnings()[1] == "thermal sensor cpu-thermal readable again (40.0 °C) after 110 s with 80 failed reads"
        for _ in range(60):
            clock.now += 1
            sw.poll()
        assert len(warnings()) == 2


def test_the_latency_loop_times_the_real_artefact_and_leaves_a_budget_it_meets_alone(bundle: Path, board: Board,
                                                                                     tmp_path: Path) -> None:
    """With the real runtime the loop sees real timings: the tiny model runs far inside its 41 ms budget,
    so the loop never switches and has nothing to save."""
    lut = tmp_path / "lut.json"
    shutil.copy(bundle / "lut.json", lut)
    clock = Clock()
    with switcher(bundle, board, lut=lut, clock=clock, prefetch=False, latency_loop=LoopSettings()) as sw:
        for _ in range(30):
            assert sw.predict(IMAGE).heads == 12
            clock.now += 0.1
        status = sw.latency_status()
        assert 0 < status["p90_ms"][12] < 41 and status["cap"] == 12 and status["ignored"] == {}
        assert [e.to_heads for e in sw.events] == [12]
    assert not (tmp_path / "lut.correction.json").exists()


# --- Android's thermal headroom forecast ----------------------------------------------------------

class Phone:
    """``dumpsys thermalservice``, ``cmd thermalservice headroom 10`` and ``dumpsys battery`` as a phone
    prints them; ``headroom`` is the command's text (None: the command fails), 80 % discharging."""

    def __init__(self) -> None:
        self.status = 0
        self.forecast(0.5)

    def forecast(self, value: float) -> None:
        self.headroom = f"Headroom in 10 seconds: {value}\n"

    def run(self, argv) -> str | None:
        if list(argv[:3]) == ["cmd", "thermalservice", "headroom"]:
            return self.headroom
        if "thermalservice" in argv:
            return f"Thermal Status: {self.status}\n"
        return "  AC powered: false\n  status: 3\n  level: 80\n"


def phone_switcher(tmp_path: Path, phone: Phone, clock: Clock, table_signals: dict = PHONE_SIGNALS,
                   signals: dict = PHONE_SIGNALS, edit: Callable[[dict], None] = lambda doc: None) -> Switcher:
    """A manifest-only Android bundle (no engine is loaded: only polls) whose table picks 12, 9, 6 and 3 heads
    for NONE, LIGHT, MODERATE and SEVERE or hotter at 80 % (latencies 10/20/30/40 ms, budget 41 ms)."""
    soak = Derating(heads=12, duration_s=60, samples=[], by_temperature=[],
                    by_thermal_status={"NONE": 1.0, "LIGHT": 1.3, "MODERATE": 1.9, "SEVERE": 3.5})
    doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, 41, soak=soak, signals=table_signals)
    edit(doc)
    (tmp_path / "bundle" / "lut.json").write_text(json.dumps(doc))
    return Switcher(tmp_path / "bundle", signals=signals, run=phone.run, clock=clock)


def test_a_forecast_at_or_past_severe_counts_as_severe_whatever_the_status(tmp_path: Path) -> None:
    phone, clock = Phone(), Clock()
    with phone_switcher(tmp_path, phone, clock) as sw:
        assert sw.table.thermal_headroom and sw.poll() == 12
        phone.forecast(0.99)  # just short of severe: the status alone
        clock.now += 1
        assert sw.poll() == 12
        phone.forecast(1.0)
        clock.now += 1
        assert sw.poll() == 3 and sw.reading.thermal == 3.0
        assert sw.events[-1].reason == "state: thermal headroom 1 counts as SEVERE"
        phone.status = 5  # a status hotter than the forecast's band is the band
        phone.forecast(1.5)
        clock.now += 1
        assert sw.poll() == 3 and sw.reading.thermal == 5.0


@pytest.mark.parametrize("bad", ["Headroom in 10 seconds: NaN\n", "Error: thermal HAL is not ready\n", None,
                                 "Headroom in 10 seconds: -0.5\n", "Headroom in 10 seconds: 11.0\n", "garbage\n"])
def test_a_failed_forecast_is_held_then_the_hottest_band_and_heads_return_after_raise_after_s(
        tmp_path: Path, bad: str | None, caplog: pytest.LogCaptureFixture) -> None:
    phone, clock = Phone(), Clock()
    with caplog.at_level(logging.WARNING, logger="hydra_edge.switcher"), phone_switcher(tmp_path, phone, clock) as sw:
        assert sw.poll() == 12
        phone.headroom = bad
        for _ in range(29):  # held for stale_after_s (30 s): one bad forecast moves nothing
            clock.now += 1
            assert sw.poll() == 12
        clock.now += 1
        assert sw.poll() == 3 and math.isnan(sw.reading.thermal)
        assert sw.events[-1].reason == "state: thermal headroom unknown since 30 s"
        phone.forecast(0.4)
        waited = 0
        while sw.poll() == 3:  # never more heads before raise_after_s of fresh forecasts
            clock.now += 1
            waited += 1
        assert sw.heads == 12 and waited >= sw.settings.raise_after_s
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and warnings[0].startswith("thermal headroom unreadable (")  # once, not per poll
    assert warnings[1].startswith("thermal headroom readable again (0.4) after ")


@pytest.mark.parametrize("case", ["table without headroom", "profile without headroom", "table before headroom"])
def test_the_forecast_plays_no_part_unless_the_table_and_the_profile_name_it(tmp_path: Path, case: str) -> None:
    """A phone that cannot forecast drops the profile's line; a board's or an older table never names it."""
    phone, clock = Phone(), Clock()
    kw = {"table without headroom": {"table_signals": ANDROID_SIGNALS},
          "profile without headroom": {"signals": ANDROID_SIGNALS},
          "table before headroom": {"edit": lambda doc: doc["thermal"].pop("headroom")}}[case]
    with phone_switcher(tmp_path, phone, clock, **kw) as sw:
        for headroom in ["Headroom in 10 seconds: 1.5\n", "Headroom in 10 seconds: NaN\n", None] * 20:
            phone.headroom = headroom
            assert sw.poll() == 12
            clock.now += 1
        assert [e.reason for e in sw.events] == ["start"]


def test_an_unknown_forecast_is_assumed_hot_where_the_profile_says_so(tmp_path: Path) -> None:
    phone, clock = Phone(), Clock()
    signals = {**PHONE_SIGNALS, "assumed_hot": 2.0, "stale_after_s": 5}  # MODERATE
    with phone_switcher(tmp_path, phone, clock, signals=signals) as sw:
        assert sw.poll() == 12
        phone.headroom = "Headroom in 10 seconds: NaN\n"
        clock.now += 5
        assert sw.poll() == 6 and sw.reading.thermal == 2.0
