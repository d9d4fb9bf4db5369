"""The device-side runner (calibration/runner.py) on its own, as a board runs it: only the files
the calibrator pushes, no torch, and artefacts whose outputs are wrong reported, never timed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    events, modules = run_runner(pushed, "--bundle", bundle, "--runs", 7, "--warmup", 1)
    assert modules["code"] in (None, 0)
    assert modules["files"] and all(f.startswith(str(pushed)) for f in modules["files"])
    assert [e["event"] for e in events] == ["device", "result", "result", "result", "done"]
    assert events[0]["runtimes"]["onnxruntime"] and events[0]["device"]["cores"] >= 1
    for e, heads in zip(events[1:4], (3, 6, 12)):
        assert e["heads"] == heads and e["status"] == "ok" and e["golden"]["passed"]
        assert e["latency"]["count"] == 7 and e["latency"]["p50_ms"] > 0 and e["peak_rss_mb"] > 0


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
                                           ("--soak-interval", "nan"), ("--soak-seconds", "inf")])
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
