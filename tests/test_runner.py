"""The device-side runner (calibration/runner.py) on its own, as a board runs it: only the files
the calibrator pushes, no torch, and artefacts whose outputs are wrong reported, never timed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from support.bundles import make_bundle
from support.runner import run_runner
from support.targets import HOST_TARGET

from hydra_edge.atomic import sha256_file
from hydra_edge.bounds import MAX_RUNS
from hydra_edge.measure.exits import exit_code, reporting_exit
from hydra_edge.records.manifest import read_manifest

pytestmark = pytest.mark.slow  # converts a bundle and runs the device runner


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("onnx"), HOST_TARGET, "3,6,12")


def test_the_pushed_files_suffice_and_torch_is_never_imported(bundle: Path, pushed: Path) -> None:
    events, modules = run_runner(pushed, "--bundle", bundle, "--runs", 7, "--warmup", 1, "--min-seconds", 0,
                                 "--cap-seconds", 5, "--seed", 1)
    assert modules["code"] in (None, 0)
    assert modules["files"] and all(f.startswith(str(pushed)) for f in modules["files"])
    kinds = [e["event"] for e in events]
    assert kinds[:4] == ["device", "loaded", "loaded", "loaded"] and kinds[-1] == "done"
    assert events[0]["runtimes"]["onnxruntime"] and events[0]["device"]["cores"] >= 1
    results = {e["heads"]: e for e in events if e["event"] == "result"}
    assert sorted(results) == [3, 6, 12]
    for e in results.values():
        lat = e["latency"]
        assert e["status"] == "ok" and e["golden"]["passed"] and e["peak_rss_mb"] > 0
        assert lat["count"] >= 7 and lat["count"] == sum(len(b["latencies_ms"]) for b in e["blocks"])
        if e["stopped"] == "interval":  # else its 5 s cap ran out first
            assert (1 - 0.05) * lat["p90_ms"] <= lat["p90_low_ms"] <= lat["p90_ms"] <= lat["p90_high_ms"] \
                <= (1 + 0.05) * lat["p90_ms"]


def test_rounds_visit_the_open_head_counts_in_a_new_order_and_each_block_follows_it(bundle: Path,
                                                                                      pushed: Path) -> None:
    """Blocks of 5 runs and 0.02 s, a 1 s floor: every head count runs many rounds; each round's blocks
    come in its order, and a head count leaves the rounds once its result is out."""
    events, _ = run_runner(pushed, "--bundle", bundle, "--warmup", 0, "--block-seconds", 0.02, "--seed", 3)
    timed: list[int] = []
    done: set[int] = set()
    for e in [e for e in events if e["event"] in ("round", "block", "result")] + [{"event": "round", "order": []}]:
        if e["event"] == "round":
            if timed:
                assert timed == order, (timed, order)
            order, timed = e["order"], []
            assert not done & set(order) and e.get("gate", {}).get("outcome") in (None, "ready", "ungated")
        elif e["event"] == "block":
            timed.append(e["heads"])
        else:
            done.add(e["heads"])
    orders = [tuple(e["order"]) for e in events if e["event"] == "round" and len(e["order"]) == 3]
    assert len(orders) >= 5 and len(set(orders)) > 1


def test_a_cap_too_small_for_any_interval_keeps_the_runs_without_one(bundle: Path, pushed: Path) -> None:
    events, _ = run_runner(pushed, "--bundle", bundle, "--warmup", 0, "--cap-seconds", 0, "--block-seconds", 0,
                           "--only", "h3_onnx_fp32")
    (result,) = [e for e in events if e["event"] == "result"]
    assert result["status"] == "ok" and result["stopped"] == "cap" and result["latency"]["count"] == 5
    assert result["latency"]["p90_low_ms"] is None and result["latency"]["p90_high_ms"] is None


def test_a_resumed_runner_goes_on_from_the_blocks_it_is_given(bundle: Path, pushed: Path, tmp_path: Path) -> None:
    """Given 3 heads' block of round 4 (60 timings, 1 to 3.95 ms: no tight interval), it numbers its rounds
    from 5 and counts that block with its own: a head count that was half-timed is not timed afresh."""
    given = {"round": 4, "latencies_ms": [round(1.0 + 0.05 * i, 6) for i in range(60)], "spent_s": 0.2}
    resume = tmp_path / "resume.json"
    resume.write_text(json.dumps({"first_round": 5, "blocks": {"h3_onnx_fp32": [given]}}))
    events, _ = run_runner(pushed, "--bundle", bundle, "--warmup", 0, "--min-seconds", 0, "--cap-seconds", 3,
                           "--only", "h3_onnx_fp32", "--resume", resume)
    rounds = [e["round"] for e in events if e["event"] == "round"]
    (result,) = [e for e in events if e["event"] == "result"]
    assert rounds[0] == 5 and result["blocks"][0] == given
    assert [b["round"] for b in result["blocks"][1:]] == rounds
    assert result["latency"]["count"] == 60 + sum(len(b["latencies_ms"]) for b in result["blocks"][1:])


def _copy(bundle: Path, to: Path) -> Path:
    shutil.copytree(bundle, to)
    return to


def test_outputs_outside_tolerance_are_reported_not_timed(bundle: Path, pushed: Path, tmp_path: Path) -> None:
    """As if the runtime computed garbage: the reference no longer matches what the model outputs."""
    broken = _copy(bundle, tmp_path / "bundle")
    manifest = read_manifest(broken)
    record = manifest.by_id()["h6_onnx_fp32"]
    golden = broken / record.golden["file"]
    with np.load(golden) as z:
        pair = {k: z[k] for k in z.files}
    pair["reference"] = np.random.default_rng(0).standard_normal(pair["reference"].shape).astype(np.float32)
    np.savez(golden, **pair)
    record.golden["sha256"] = sha256_file(golden)
    manifest.write(broken)
    events, _ = run_runner(pushed, "--bundle", broken, "--runs", 3)
    results = {e["heads"]: e for e in events if e["event"] == "result"}
    assert results[6]["status"] == "golden_failed" and "latency" not in results[6]
    assert "outside tolerance, not timed" in results[6]["error"] and not results[6]["golden"]["passed"]
    assert results[3]["status"] == results[12]["status"] == "ok"


def test_a_corrupted_artefact_is_refused_by_sha256(bundle: Path, pushed: Path, tmp_path: Path) -> None:
    broken = _copy(bundle, tmp_path / "bundle")
    with open(broken / "vit_h12_onnx_fp32.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff")
    events, _ = run_runner(pushed, "--bundle", broken, "--runs", 3, "--only", "h12_onnx_fp32")
    (result,) = [e for e in events if e["event"] == "result"]
    assert result["status"] == "error" and "vit_h12_onnx_fp32.onnx is missing or its sha256 differs" in result["error"]


def test_no_bundle_is_a_fatal_line(pushed: Path, tmp_path: Path) -> None:
    events, modules = run_runner(pushed, "--bundle", tmp_path / "nothing")
    assert modules["code"] == 2 and events[-1]["event"] == "fatal" and "no manifest" in events[-1]["message"]


@pytest.mark.parametrize("option, value", [("--runs", "10000000000000"), ("--warmup", "-1"), ("--threads", "100000"),
                                           ("--soak-interval", "nan"), ("--soak-seconds", "inf"), ("--within", "0"),
                                           ("--cap-seconds", "inf"), ("--gate-margin-c", "nan")])
def test_numbers_out_of_bounds_stop_the_runner_before_it_reads_anything(pushed: Path, tmp_path: Path, option: str,
                                                                        value: str) -> None:
    done = subprocess.run([sys.executable, str(pushed / "calibration" / "runner.py"), "--bundle", str(tmp_path),
                           option, value], capture_output=True, text=True, timeout=60, cwd=pushed.parent)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith(f"runner.py: error: argument {option}: {value} is not")


def test_a_missing_runtime_stops_the_runner_in_one_line(bundle: Path, pushed: Path) -> None:
    """Not one error per artefact and exit 0: one fatal line naming the package and how to install it."""
    events, modules = run_runner(pushed, "--bundle", bundle, blocked="onnxruntime")
    assert modules["code"] == 2 and [e["event"] for e in events] == ["fatal"]
    assert "lacks the Python package(s) onnxruntime" in events[0]["message"]
    assert "-m pip install 'onnxruntime>=" in events[0]["message"]


def test_the_runner_stops_when_its_host_goes(bundle: Path, pushed: Path) -> None:
    """Started as the calibrator starts it (under ``reporting_exit``, stdin held by the host): when that
    stdin reaches its end, which is what a killed host, Ctrl-C or a dropped link looks like from the
    board over ssh, adb or locally, the runner is stopped mid-timing and its status still reported."""
    argv = reporting_exit([sys.executable, str(pushed / "calibration" / "runner.py"), "--bundle", str(bundle),
                           "--runs", str(MAX_RUNS), "--warmup", "0"])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=pushed.parent,
                            start_new_session=True)
    try:
        assert json.loads(proc.stdout.readline())["event"] == "device"  # now timing, for hours
        time.sleep(0.5)
        assert proc.poll() is None
        rest, _ = proc.communicate(timeout=20)  # closes its stdin, then reads to the end
        assert exit_code(rest.strip().splitlines()[-1]) == 128 + signal.SIGTERM  # the runner itself was stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_runtime_threads_never_exceed_the_device_cores(bundle: Path, pushed: Path) -> None:
    """Asked for more threads than the board has, the runner gives each runtime one per core: an
    oversubscribed runtime spins and stalls, and its latency would describe nothing real."""
    spy = ("import json, os, runpy, sys\n"
           "sys.path.insert(0, os.getcwd() + '/runner')\n"
           "import hydra_edge.runtime.engines as engines\n"
           "real = engines.load_bytes\n"
           "def load_bytes(data, name, threads, format, runtime=None):\n"
           "    print(json.dumps({'event': 'load', 'threads': threads}), flush=True)\n"
           "    return real(data, name, threads, format, runtime)\n"
           "engines.load_bytes = load_bytes\n"
           "runner, sys.argv = sys.argv[1], sys.argv[1:]\n"
           "runpy.run_path(runner, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", spy, str(pushed / "calibration" / "runner.py"), "--bundle",
                           str(bundle), "--runs", "2", "--warmup", "0", "--threads", "256"],
                          capture_output=True, text=True, timeout=120, cwd=pushed.parent)
    loads = [json.loads(line)["threads"] for line in done.stdout.splitlines() if line.startswith('{"event": "load"')]
    assert done.returncode == 0, done.stderr
    assert loads and set(loads) == {os.cpu_count()}, done.stdout


def _thermal_zone(root: Path, millidegrees: str) -> Path:
    zone = root / "sys" / "class" / "thermal" / "thermal_zone0" / "temp"
    zone.parent.mkdir(parents=True, exist_ok=True)
    zone.write_text(millidegrees)
    return zone


def _run_with(pushed: Path, bundle: Path, root: Path, during: Callable[[Path], None]) -> list[dict]:
    """The runner on a sysfs tree at 50 °C; ``during(zone file)`` runs once its first block is out."""
    zone = _thermal_zone(root, "50000\n")
    argv = [sys.executable, str(pushed / "calibration" / "runner.py"), "--bundle", str(bundle), "--warmup", "0",
            "--sysfs-root", str(root), "--gate-poll-s", "0.1", "--min-seconds", "1.5", "--block-seconds", "0.1",
            "--only", "h3_onnx_fp32", "h6_onnx_fp32"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=pushed.parent)
    assert proc.stdout is not None
    events = []
    try:
        for line in proc.stdout:
            events.append(json.loads(line))
            if events[-1]["event"] == "block" and sum(e["event"] == "block" for e in events) == 1:
                during(zone)
    finally:
        proc.wait(timeout=120)
    return events


def test_a_round_waits_for_the_start_temperature_then_times(bundle: Path, pushed: Path, tmp_path: Path) -> None:
    """The device is 8 °C hotter than it began for a second: the next round waits (the 2 °C margin), then
    starts once it is back, at the start's temperature."""
    def warm_for_a_second(zone: Path) -> None:
        zone.write_text("58000\n")
        threading.Timer(1.0, lambda: zone.write_text("50000\n")).start()

    gates = [e["gate"] for e in _run_with(pushed, bundle, tmp_path, warm_for_a_second) if e["event"] == "round"]
    assert gates[0]["outcome"] == "ready" and gates[0]["state"]["max_temp_c"] == 50.0
    waited = [g["waited_s"] for g in gates if g["waited_s"] >= 0.5]  # reading the sensor alone takes ms
    assert len(waited) == 1 and waited[0] < 5
    assert all(g["outcome"] == "ready" and g["state"]["max_temp_c"] == 50.0 for g in gates)


def test_a_sensor_that_goes_mid_calibration_is_not_waited_on(bundle: Path, pushed: Path, tmp_path: Path) -> None:
    events = _run_with(pushed, bundle, tmp_path, lambda zone: zone.unlink())
    gates = [e["gate"] for e in events if e["event"] == "round"]
    assert gates[0]["outcome"] == "ready" and len(gates) >= 2
    assert all(g["outcome"] == "reading failed" and g["why"] == "the device no longer reports max_temp_c"
               for g in gates[1:])
    assert [e["status"] for e in events if e["event"] == "result"] == ["ok", "ok"]


@pytest.mark.parametrize("available_kb, released", [(100_000, True), (600_000, False), (3_000_000, False),
                                                    (None, False)])
def test_a_board_short_of_memory_loads_again_per_block_what_it_cannot_keep(bundle: Path, pushed: Path,
                                                                           tmp_path: Path, available_kb: int | None,
                                                                           released: bool) -> None:
    """Under 15 % of a 4 GB board available, only the head count last timed stays loaded: the others are
    released (an ``unloaded`` line each time) and loaded again for their next block, and still all time and
    pass their golden check; with room (15 % exactly is enough), or a meminfo without MemAvailable (Linux
    < 3.14), nothing is released."""
    meminfo = tmp_path / "root" / "proc" / "meminfo"
    meminfo.parent.mkdir(parents=True)
    meminfo.write_text("MemTotal:        4000000 kB\nMemFree:          50000 kB\n"
                       + (f"MemAvailable:    {available_kb} kB\n" if available_kb is not None else ""))
    events, modules = run_runner(pushed, "--bundle", bundle, "--warmup", 0, "--min-seconds", 0.2,
                                 "--block-seconds", 0.02, "--cap-seconds", 3, "--seed", 2,
                                 "--sysfs-root", tmp_path / "root")
    assert modules["code"] in (None, 0)
    results = {e["heads"]: e for e in events if e["event"] == "result"}
    assert sorted(results) == [3, 6, 12] and all(e["status"] == "ok" and e["golden"]["passed"]
                                                  for e in results.values())
    unloaded = [e for e in events if e["event"] == "unloaded"]
    if not released:
        assert unloaded == []
        return
    assert {e["heads"] for e in unloaded} >= {3, 6} and all(e["available_share"] == 0.025 for e in unloaded)
    loaded_now: set[int] = set()  # what the runner holds, by its own lines: never more than the one in use
    for e in events:
        if e["event"] in ("loaded", "block"):
            loaded_now.add(e["heads"])
        elif e["event"] in ("unloaded", "result"):
            loaded_now.discard(e["heads"])
        assert len(loaded_now) <= 2, e  # the one just used, and the one about to be released after it
