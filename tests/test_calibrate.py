"""hydra-edge calibrate on a real rpi (LiteRT) bundle: --local, adb with the Python runner and with a
native benchmark_model, resume, missing runtime, --setup, no space."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from support.adbd import AdbDevice
from support.bundles import make_bundle
from support.cli import invoke, one_line_error
from support.tables import fake_bundle
from support.targets import TRT_TARGET

from hydra_edge.cli import main
from hydra_edge.logs import VERBOSE
from hydra_edge.measure.device import RuntimeMissingError, ensure_python
from hydra_edge.measure.journal import journal_path, read_calibration
from hydra_edge.measure.session import Session
from hydra_edge.records.calibration import HeadResult
from hydra_edge.transport import LocalTransport

pytestmark = pytest.mark.slow  # converts bundles, builds venvs, drives the adb stand-in


@pytest.fixture(scope="module")
def rpi_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("rpi"), "rpi", "3,12")


def test_local_calibration_writes_record_and_plot_and_resumes(rpi_bundle: Path, device_python: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "cal"
    args = ("--bundle", rpi_bundle, "--local", "--python", device_python, "--out", out, "--runs", 20, "--warmup", 2)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("local_*.json")
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cal = read_calibration(path)
    assert cal.device_id.startswith("local:") and cal.settings["runs"] == 20 and cal.settings["runner"] == "python"
    assert cal.device["cores"] == os.cpu_count() and cal.device["runtimes"]["ai-edge-litert"] == "2.3.0"
    assert cal.device["os"] and cal.device["python"] and cal.bundle["target"] == "rpi"
    assert [r.heads for r in cal.measured()] == [3, 12]
    for r in cal.results:  # timed without torch, after the golden pair passed
        lat = r.latency
        assert r.runner == "python" and r.golden["passed"] and lat["count"] >= 20
        assert r.stopped in ("interval", "cap", "runs")
        assert lat["count"] == sum(len(b.latencies_ms) for b in r.blocks) and lat["timed_s"] >= 1.0
        assert 0 < lat["min_ms"] <= lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"]
        assert r.load_s > 0 and r.peak_rss_mb > 0 and r.state_before["timestamp"] < r.state_after["timestamp"]

    again = invoke(*args)
    assert again.exit_code == 0 and "already measured" in again.output
    assert read_calibration(path) == cal

    cal.results = cal.results[:1]  # as if the connection had dropped after the first head count
    cal.write(path)
    resumed = invoke(*args)
    assert resumed.exit_code == 0, resumed.output
    final = read_calibration(path)
    assert final.results[0] == cal.results[0] and [r.heads for r in final.measured()] == [3, 12]

    # Other settings into the same file: refused in one line rather than silently replacing the measurements.
    other = [*args[:-4], "--runs", 5, "--warmup", 2]
    line = one_line_error(invoke(*other))
    assert "holds measurements of another settings; pass --force" in line and read_calibration(path) == final
    assert invoke(*other, "--force").exit_code == 0 and read_calibration(path).settings["runs"] == 5


def test_the_runners_own_output_goes_to_a_log_and_with_v_also_to_the_terminal(
        rpi_bundle: Path, device_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteRT prints its XNNPACK banner on the device runner's stderr: kept in calibration/logs/, shown with -v."""
    banner = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
    args = ["calibrate", "--bundle", str(rpi_bundle), "--local", "--python", str(device_python), "--runs", "3",
            "--warmup", "0"]
    monkeypatch.delenv(VERBOSE, raising=False)  # quiet to start with, whatever the shell running the suite says
    quiet = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "quiet.json")])
    assert quiet.exit_code == 0, quiet.output
    assert banner not in quiet.output and banner in (tmp_path / "logs" / "quiet.log").read_text()
    assert f"the device's own output: {tmp_path / 'logs' / 'quiet.log'}" in quiet.output.replace("\n", "")
    for where, argv in (("after", [*args, "-v"]), ("before", ["-v", *args])):  # either place, as users type it
        monkeypatch.delenv(VERBOSE, raising=False)
        loud = CliRunner().invoke(main, [*argv, "--out", str(tmp_path / f"{where}.json")])
        assert loud.exit_code == 0, loud.output
        assert f"local:{platform.node()}: {banner}" in loud.output, where
        assert banner in (tmp_path / "logs" / f"{where}.log").read_text()


def test_a_runtime_that_kills_the_runner_is_recorded_and_skipped(rpi_bundle: Path, device_python: Path,
                                                                 tmp_path: Path) -> None:
    """The runner dies in the first round, timing its second head count (as a segfaulting runtime would):
    that one is recorded as crashed, the other keeps its block and a re-run goes on from it without
    dying on the crashed one again, and --force tries it again."""
    dying = tmp_path / "python-that-dies"  # device, loaded x 2, round 1, one block: then it dies
    dying.write_text(f'#!/bin/sh\ncase "$1" in\n  *runner.py) "{device_python}" "$@" | head -n 5; exit 0;;\n'
                     f'  *) exec "{device_python}" "$@";;\nesac\n')
    dying.chmod(0o755)
    args = ("--bundle", rpi_bundle, "--local", "--out", tmp_path / "cal.json", "--runs", 3, "--warmup", 1,
            "--min-seconds", 0.6)  # a block is 0.25 s: at least three rounds each
    line = one_line_error(invoke(*args, "--python", dying))
    cal = read_calibration(tmp_path / "cal.json")
    first, second = cal.rounds[0].order
    assert f"{second} heads is recorded as crashed, run again to measure the rest" in line
    assert {r.heads: (r.status, len(r.blocks or [])) for r in cal.results} == {first: ("timing", 1),
                                                                                 second: ("crashed", 0)}
    again = one_line_error(invoke(*args, "--python", device_python))  # goes on, and the crash still counts
    assert again.startswith("Error: 1 head count(s) failed: local:")
    assert f" {second} heads crashed (the runner died" in again
    resumed = read_calibration(tmp_path / "cal.json").result(first)
    assert resumed.ok and resumed.blocks[0] == cal.result(first).blocks[0] and resumed.blocks[1].round == 2
    fixed = invoke(*args, "--python", device_python, "--force")
    assert fixed.exit_code == 0, fixed.output
    assert [r.status for r in read_calibration(tmp_path / "cal.json").results] == ["ok", "ok"]


def test_a_malformed_runner_result_is_one_line_and_never_saved(rpi_bundle: Path, device_python: Path,
                                                              tmp_path: Path) -> None:
    """A runner (another version, a damaged copy) reports 12 heads' result as "six": the run stops in one
    line, the record and its journal keep only what was sound (its blocks), and a run with a sound runner
    goes on from them."""
    garbling = tmp_path / "python-that-garbles"
    garbling.write_text(f'#!/bin/sh\ncase "$1" in\n  *runner.py) "{device_python}" "$@" '
                        f"| sed '/\"event\": \"result\"/s/\"heads\": 12,/\"heads\": \"six\",/'; exit 0;;\n"
                        f'  *) exec "{device_python}" "$@";;\nesac\n')
    garbling.chmod(0o755)
    out = tmp_path / "cal.json"
    args = ("--bundle", rpi_bundle, "--local", "--out", out, "--runs", 3, "--warmup", 1, "--min-seconds", 0.2)
    line = one_line_error(invoke(*args, "--python", garbling))
    assert "the runner on local:" in line and "sent a malformed result line: $.heads: expected `int`, got `str`" in line
    assert f"the results before it are saved in {out}" in line
    assert "six" not in out.read_text() and not journal_path(out).exists()
    twelve = read_calibration(out).result(12)
    assert twelve.status == "timing" and twelve.blocks
    fixed = invoke(*args, "--python", device_python)  # no --force needed
    assert fixed.exit_code == 0, fixed.output
    final = read_calibration(out)
    assert [r.heads for r in final.measured()] == [3, 12] and final.result(12).blocks[0] == twelve.blocks[0]


def test_an_empty_bundle_says_how_to_fill_it(tmp_path: Path) -> None:
    """Once "the bundle has no None artefacts; choose --quant from []"."""
    line = one_line_error(invoke("--bundle", fake_bundle(tmp_path / "bundle", []), "--local", "--out", tmp_path / "cal"))
    assert line == ("Error: the bundle has no artefacts; convert some into it with hydra-edge convert "
                    "(with --optional where the target's artefacts are all optional)")


def test_an_error_before_any_progress_bar_is_the_only_line(tmp_path: Path) -> None:
    """A device that fails before its progress bar appears leaves no empty bar line above its error."""
    result = invoke("--bundle", fake_bundle(tmp_path / "bundle", []), "--local", "--out", tmp_path / "cal")
    assert result.output == one_line_error(result) + "\n", repr(result.output)


def test_a_device_without_the_runtime_gets_one_line(rpi_bundle: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a Python with nothing installed, as on a fresh board
    assert os.system(f"'{sys.executable}' -m venv --without-pip '{bare}'") == 0
    line = one_line_error(invoke("--bundle", rpi_bundle, "--local", "--python", bare / "bin" / "python",
                                 "--out", tmp_path / "cal"))
    assert "lacks the Python package(s) numpy ai-edge-litert>=2.3.0" in line
    assert "-m pip install numpy 'ai-edge-litert>=2.3.0'" in line and "--setup" in line  # pasted as is: quoted
    line = one_line_error(invoke("--bundle", rpi_bundle, "--local", "--python", tmp_path / "no python",
                                 "--out", tmp_path / "cal"))
    assert "there is no Python at" in line and "--python PATH" in line


def _wheel(folder: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel, so pip can install a 'runtime' with no network."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name.replace('-', '_')}/__init__.py", f"VERSION = {version!r}\n")
        whl.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        whl.writestr(f"{dist}.dist-info/RECORD", "")


def test_setup_makes_a_venv_once_and_pip_installs_the_missing_runtime(tmp_path: Path) -> None:
    """--setup's logic with a stand-in runtime package (no network here; numpy and LiteRT need PyPI)."""
    wheels = tmp_path / "wheels"
    _wheel(wheels, "hydra-fake-runtime", "1.0")
    need = {"hydra_fake_runtime": "hydra-fake-runtime>=1.0"}
    offline = ("--no-index", f"--find-links={wheels}")
    with LocalTransport(tmp_path / "device dir") as t:
        with pytest.raises(RuntimeMissingError, match="lacks the Python package.s. hydra-fake-runtime>=1.0"):
            ensure_python(t, sys.executable, need, setup=False)
        # A venv whose creation was interrupted before pip went in is made again, not reused.
        assert os.system(f"'{sys.executable}' -m venv --without-pip '{t.remote_path('venv')}'") == 0
        python = ensure_python(t, sys.executable, need, setup=True, pip_args=offline)
        assert python == t.remote_path("venv", "bin", "python")
        assert t.run([python, "-c", "import hydra_fake_runtime as m; print(m.VERSION)"]).stdout.strip() == "1.0"
        for whl in wheels.iterdir():
            whl.unlink()  # a second pip install would now fail: reuse must not need it
        assert ensure_python(t, sys.executable, need, setup=True, pip_args=offline) == python
        with pytest.raises(RuntimeMissingError, match="pip could not install hydra-other"):
            ensure_python(t, sys.executable, {"hydra_other": "hydra-other"}, setup=True, pip_args=offline)


def test_no_space_on_the_device_is_one_line(rpi_bundle: Path, device_python: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LocalTransport, "free_bytes", lambda self, remote_dir: 1000)
    line = one_line_error(invoke("--bundle", rpi_bundle, "--local", "--python", device_python,
                                 "--out", tmp_path / "cal"))
    assert "no space on local:" in line and "free some space" in line


def test_adb_with_the_python_runner(rpi_bundle: Path, device_python: Path, adb_device: AdbDevice,
                                    tmp_path: Path) -> None:
    result = invoke("--bundle", rpi_bundle, "--serial", adb_device.serial, "--adb-port", adb_device.server.port,
                    "--python", device_python, "--out", tmp_path / "phone.json", "--runs", 5, "--warmup", 1)
    assert result.exit_code == 0, result.output
    cal = read_calibration(tmp_path / "phone.json")
    assert cal.device_id == f"adb:{adb_device.serial}" and [r.heads for r in cal.measured()] == [3, 12]
    assert (tmp_path / "phone.png").is_file()
    assert adb_device.host_path("/data/local/tmp/hydra-edge/runner/calibration/runner.py").is_file()


# benchmark_model's real output layout; the fake below fills in numbers from its own arguments.
FAKE_BENCHMARK_MODEL = r"""#!/bin/sh
graph=""; runs=50; warmup=1; threads=1
for arg in "$@"; do
  case "$arg" in
    --graph=*) graph="${arg#--graph=}" ;;
    --num_runs=*) runs="${arg#--num_runs=}" ;;
    --warmup_runs=*) warmup="${arg#--warmup_runs=}" ;;
    --num_threads=*) threads="${arg#--num_threads=}" ;;
  esac
done
echo "INFO: STARTING!"
echo "INFO: Num threads: [$threads]"
echo "INFO: Graph: [$graph]"
[ -f "$graph" ] || { echo "ERROR: Could not open '$graph'." >&2; echo "ERROR: Failed to load model" >&2; exit 1; }
status=$(cat "$STATE" 2>/dev/null || echo 0)
avg=$((1000 + 500 * status))
echo "INFO: Loaded model $graph"
echo "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
echo "INFO: Initialized session in 12.5ms."
echo "INFO: Running benchmark for at least $warmup iterations and at least 0 seconds but terminate if exceeding 150 seconds."
echo "INFO: count=$warmup first=2100 curr=$avg min=$avg max=2100 avg=$avg std=10"
echo ""
echo "INFO: Running benchmark for at least $runs iterations and at least 0 seconds but terminate if exceeding 150 seconds."
if [ "$runs" -le 2 ]; then  # its Stat line names the first and the newest run: each run's time
  echo "INFO: count=$runs first=$avg curr=$((avg + 20)) min=$avg max=$((avg + 20)) avg=$((avg + 10)) std=10"
else
  echo "INFO: count=$runs first=$avg curr=$avg min=$((avg - 50)) max=$((avg + 80)) avg=$avg std=20"
fi
echo ""
echo "INFO: Inference timings in us: Init: 12500, First inference: 2100, Warmup (avg): $avg, Inference (avg): $avg"
echo "INFO: Memory footprint delta from the start of the tool (MB): init=3.5 overall=4.25"
echo "INFO: Overall peak memory footprint (MB) via periodic monitoring: 9.75"
"""

# dumpsys in its real layout; each thermalservice call heats the fake phone a little, up to SEVERE, then it
# cools at once and heats again.
FAKE_DUMPSYS = r"""#!/bin/sh
case "$1" in
  thermalservice)
    calls=$(( $(cat "$CALLS" 2>/dev/null || echo 0) + 1 )); echo $calls > "$CALLS"
    status=$(( calls / 4 % 4 )); echo $status > "$STATE"
    printf 'IsStatusOverride: false\nThermal Status: %s\nCached temperatures:\n' "$status"
    printf '\tTemperature{mValue=%s.5, mType=0, mName=cpu0, mStatus=%s}\n' $((40 + 5 * status)) "$status"
    printf 'HAL Ready: true\n' ;;
  battery)
    printf 'Current Battery Service state:\n  AC powered: false\n  USB powered: true\n  status: 2\n'
    printf '  level: 78\n  scale: 100\n  temperature: 312\n' ;;
  *) echo "Can't find service: $1"; exit 1 ;;
esac
"""


def test_adb_with_a_native_benchmark_model_and_soak(rpi_bundle: Path, adb_device: AdbDevice, tmp_path: Path) -> None:
    """Phones have no Python: the user's benchmark_model is pushed and run in the plan's rounds, two runs per
    invocation (the most whose each time it prints), until each p90's interval is met; the phone's thermal
    status and battery come from dumpsys over adb, and the gate waits on them (here never long enough: the
    fake phone only heats)."""
    bin_dir = adb_device.sandbox.parent / "bin"  # on the stand-in phone's PATH
    state, calls = tmp_path / "thermal-status", tmp_path / "dumpsys-calls"
    paths = f"#!/bin/sh\nCALLS='{calls}'\nSTATE='{state}'\n"
    (bin_dir / "dumpsys").write_text(FAKE_DUMPSYS.replace("#!/bin/sh\n", paths, 1))
    (bin_dir / "dumpsys").chmod(0o755)
    binary = tmp_path / "benchmark_model"
    binary.write_text(FAKE_BENCHMARK_MODEL.replace("#!/bin/sh\n", paths, 1))
    try:
        result = invoke("--bundle", rpi_bundle, "--serial", adb_device.serial, "--adb-port", adb_device.server.port,
                        "--runner", binary, "--out", tmp_path / "cal", "--runs", 30, "--soak", "2s",
                        "--min-seconds", 0, "--gate-max-wait", 0)
    finally:
        (bin_dir / "dumpsys").unlink()
    assert result.exit_code == 0, result.output
    cal = read_calibration(tmp_path / "cal" / f"adb_{adb_device.serial.replace(':', '_')}.json")
    assert cal.settings["runner"] == "benchmark_model"
    assert cal.device["model"] == "Hydra Test Phone" and cal.device["os"] == "Android 14"
    assert cal.settings["rounds"]["within"] == 0.05
    for r in cal.results:
        assert r.ok and r.runner == "benchmark_model" and r.golden["checked"] is False
        # invocations of two runs (the first and the newest, as its Stat line printed them) until at least 40, the
        # fewest that give the p90's interval an upper end (past --runs 30), and the interval is met
        assert r.stopped == "interval" and {len(b.latencies_ms) for b in r.blocks} == {2} and len(r.blocks) >= 20
        assert all(b.latencies_ms[1] - b.latencies_ms[0] == pytest.approx(0.02) for b in r.blocks)
        assert r.latency["count"] == 2 * len(r.blocks) and r.latency["mean_ms"] >= 1.0
        runs = [v for b in r.blocks for v in b.latencies_ms]
        assert r.latency["p90_ms"] == pytest.approx(float(np.percentile(runs, 90)))
        assert r.p90_interval_ms is not None and r.p90_interval_ms[0] <= r.latency["p90_ms"] <= r.p90_interval_ms[1]
        assert r.load_s == pytest.approx(0.0125) and r.peak_rss_mb == pytest.approx(9.75)
        assert r.state_before["battery_capacity"] == 78 and r.state_before["charging"] is True
        assert r.state_before["android_thermal_status"] is not None
    # every round was gated on the phone's state: started at once when it was back at its start's, else after
    # --gate-max-wait, saying why
    assert [r.round for r in cal.rounds] == list(range(1, 1 + max(len(r.blocks) for r in cal.results)))
    assert {r.gate["outcome"] for r in cal.rounds} == {"ready", "timeout"}
    assert all("°C, over 40.5 + 2" in r.gate["why"] for r in cal.rounds if r.gate["outcome"] == "timeout")
    assert "round(s) started before the device was back in its start state" in result.output
    soak = cal.soak
    assert soak is not None and soak.heads == 12 and len(soak.samples) >= 2
    assert 1.0 in soak.by_thermal_status.values()  # the mildest status seen is the baseline
    assert max(soak.by_thermal_status.values()) > 1.0  # the fake phone slows as it heats
    assert soak.by_temperature and soak.by_temperature[0][1] == 1.0
    assert json.loads((tmp_path / "cal" / f"adb_{adb_device.serial.replace(':', '_')}.json").read_text())["soak"]
    log = (tmp_path / "cal" / "logs" / f"adb_{adb_device.serial.replace(':', '_')}.log").read_text()
    assert "benchmark_model's own output" in log and "INFO: Created TensorFlow Lite XNNPACK delegate" in log
    assert "Inference timings in us" in log and "Inference timings" not in result.output  # kept off the terminal


def test_local_runs_the_interpreter_running_hydra_edge(rpi_bundle: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Not whatever `python3` is first on PATH (often one without the runtime)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'not the Python running hydra-edge' >&2\nexit 3\n")
    (bin_dir / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = invoke("--bundle", rpi_bundle, "--local", "--out", tmp_path / "cal.json", "--runs", 3, "--warmup", 1)
    assert result.exit_code == 0, result.output
    assert [r.heads for r in read_calibration(tmp_path / "cal.json").measured()] == [3, 12]


def test_a_native_calibration_whose_link_drops_goes_on_from_its_blocks(rpi_bundle: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The link drops at the 7th invocation of benchmark_model: one line saying what is kept and to run again,
    the blocks timed so far in the record; the same command goes on from them, its rounds numbered after the
    last, without timing those runs again."""
    from hydra_edge.measure import native
    from hydra_edge.transport import ConnectionLostError

    binary = tmp_path / "benchmark_model"
    binary.write_text(FAKE_BENCHMARK_MODEL.replace("#!/bin/sh\n", f"#!/bin/sh\nSTATE='{tmp_path / 'state'}'\n", 1))
    binary.chmod(0o755)
    real, calls = native.invoke, []

    def dropping(*args: object, **kwargs: object) -> native.NativeRun:
        calls.append(args)
        if len(calls) == 7:
            raise ConnectionLostError("the connection to local dropped")
        return real(*args, **kwargs)

    out = tmp_path / "cal.json"
    argv = ("--bundle", rpi_bundle, "--local", "--runner", binary, "--out", out, "--runs", 6, "--min-seconds", 0,
            "--gate-max-wait", 0)
    monkeypatch.setattr(native, "invoke", dropping)
    first = invoke(*argv)
    assert one_line_error(first).endswith(f"every block timed so far are saved in {out}, run the same command "
                                                 "again to go on")
    kept = read_calibration(out)
    timed = {r.heads: r.blocks for r in kept.results}
    assert {r.status for r in kept.results} == {"timing"} and sum(map(len, timed.values())) == 6
    monkeypatch.setattr(native, "invoke", real)
    second = invoke(*argv)
    assert second.exit_code == 0, second.output
    done = read_calibration(out)
    assert [r.round for r in done.rounds] == list(range(1, len(done.rounds) + 1))
    for r in done.results:
        assert r.ok and r.stopped == "interval" and r.blocks[:len(timed[r.heads])] == timed[r.heads]
        assert r.latency["count"] == sum(len(b.latencies_ms) for b in r.blocks) >= 40


def test_block_warmup_and_gate_headroom_reach_the_plan(rpi_bundle: Path, tmp_path: Path) -> None:
    """A head count's first invocation warms up --warmup runs, every later one --block-warmup; both options and
    --gate-headroom are the record's settings (a record with others is not resumed); bad values are one line."""
    calls = tmp_path / "calls"
    binary = tmp_path / "benchmark_model"
    binary.write_text(FAKE_BENCHMARK_MODEL.replace(
        "#!/bin/sh\n", f"#!/bin/sh\nSTATE='{tmp_path / 'state'}'\necho \"$@\" >> '{calls}'\n", 1))
    binary.chmod(0o755)
    out = tmp_path / "cal.json"
    result = invoke("--bundle", rpi_bundle, "--local", "--runner", binary, "--out", out, "--runs", 6, "--warmup", 3,
                    "--block-warmup", 0, "--gate-headroom", 0.5, "--min-seconds", 0, "--gate-max-wait", 0)
    assert result.exit_code == 0, result.output
    rounds = read_calibration(out).settings["rounds"]
    assert rounds["block_warmup"] == 0 and rounds["gate_headroom"] == 0.5
    for heads_file in ("vit_h3_", "vit_h12_"):
        warmups = [word for line in calls.read_text().splitlines() if heads_file in line for word in line.split()
                   if word.startswith("--warmup_runs=")]
        assert warmups[0] == "--warmup_runs=3" and set(warmups[1:]) == {"--warmup_runs=0"} and len(warmups) == 20
    for option, value in (("--gate-headroom", -0.1), ("--block-warmup", 1.5)):
        bad = invoke("--bundle", rpi_bundle, "--local", "--out", tmp_path / "x.json", option, value)
        assert bad.exit_code == 2 and f"Error: Invalid value for '{option}'" in bad.output
        assert not (tmp_path / "x.json").exists()


def test_native_runner_threads_are_capped_at_the_device_cores(rpi_bundle: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    binary = tmp_path / "benchmark_model"
    binary.write_text(FAKE_BENCHMARK_MODEL.replace(
        "#!/bin/sh\n", f"#!/bin/sh\nSTATE='{tmp_path / 'state'}'\necho \"$@\" >> '{calls}'\n", 1))
    binary.chmod(0o755)
    cores = len(os.sched_getaffinity(0))  # what the device's nproc says
    for asked, expected in (("64", cores), (None, min(4, cores))):  # rpi's target threads: 4
        result = invoke("--bundle", rpi_bundle, "--local", "--runner", binary, "--out", tmp_path / f"{asked}.json",
                        "--runs", 6, "--min-seconds", 0, "--gate-max-wait", 0, *(("--threads", asked) if asked else ()))
        assert result.exit_code == 0, result.output
        used = [word for line in calls.read_text().splitlines() for word in line.split()
                if word.startswith("--num_threads=")]
        assert used == [f"--num_threads={expected}"] * 40  # 20 invocations of two runs per head count
        calls.unlink()


# trtexec's real output layout (TensorRT 10), numbers from its own arguments; it notes each model it opens.
FAKE_TRTEXEC = r"""#!/bin/sh
onnx=""; iterations=10; times=""
for arg in "$@"; do
  case "$arg" in
    --onnx=*) onnx="${arg#--onnx=}" ;;
    --iterations=*) iterations="${arg#--iterations=}" ;;
    --exportTimes=*) times="${arg#--exportTimes=}" ;;
  esac
done
echo "&&&& RUNNING TensorRT.trtexec [TensorRT v101600] [b72] # trtexec $*"
if [ ! -f "$onnx" ]; then
  echo "[11/23/2026-06:00:00] [E] Failed to parse onnx file"
  echo "&&&& FAILED TensorRT.trtexec [TensorRT v101600] [b72] # trtexec $*"; exit 1
fi
echo "$* $(sha256sum "$onnx" | cut -d' ' -f1)" >> "$CALLS"
echo "[11/23/2026-06:00:01] [I] Engine built in 3.10201 sec."
echo "[11/23/2026-06:00:01] [I] Engine deserialized in 0.0033933 sec."
echo "[11/23/2026-06:00:01] [I] Timing trace has $iterations queries over 0.0420 s"
echo "[11/23/2026-06:00:01] [I] === Performance summary ==="
echo "[11/23/2026-06:00:01] [I] Throughput: 18392 qps"
echo "[11/23/2026-06:00:01] [I] Latency: min = 0.5 ms, max = 0.9 ms, mean = 0.6 ms, median = 0.58 ms, percentile(90%) = 0.7 ms, percentile(95%) = 0.75 ms, percentile(99%) = 0.85 ms"
echo "[11/23/2026-06:00:01] [I] H2D Latency: min = 0.01 ms, max = 0.02 ms, mean = 0.011 ms, median = 0.011 ms, percentile(90%) = 0.012 ms, percentile(95%) = 0.013 ms, percentile(99%) = 0.015 ms"
if [ -n "$times" ]; then  # each query's timings, in --exportTimes' layout: 0.50, 0.51, ... 0.59 ms over and over
  i=0; sep=" "; echo "[" > "$times"
  while [ $i -lt "$iterations" ]; do
    echo "$sep{ \"startEnqMs\" : $i, \"computeMs\" : 0.4, \"latencyMs\" : 0.5$((i % 10)), \"endToEndMs\" : 0.6 }" >> "$times"
    sep=", "; i=$((i + 1))
  done
  echo "]" >> "$times"
fi
echo "&&&& PASSED TensorRT.trtexec [TensorRT v101600] [b72] # trtexec $*"
"""


def test_trtexec_times_a_compact_bundle_from_model_files_rebuilt_on_the_host(tmp_path: Path) -> None:
    """A native tool opens a model file: each compact artefact is rebuilt on the host, checked and pushed whole."""
    from hydra_edge.records.manifest import read_manifest

    bundle = make_bundle(tmp_path / "b", TRT_TARGET, "3,12", layout="compact")
    small, large = read_manifest(bundle).artefacts
    assert small.compact is not None and large.compact is None and not (bundle / small.file).exists()
    calls, binary, device = tmp_path / "calls", tmp_path / "trtexec", tmp_path / "device"
    binary.write_text(FAKE_TRTEXEC.replace("#!/bin/sh\n", f"#!/bin/sh\nCALLS='{calls}'\n", 1))
    binary.chmod(0o755)
    out = tmp_path / "cal.json"
    result = invoke("--bundle", bundle, "--local", "--remote-dir", device, "--runner", binary, "--out", out,
                    "--runs", 7, "--min-seconds", 0, "--gate-max-wait", 0)
    assert result.exit_code == 0, result.output
    cal = read_calibration(out)
    assert cal.settings["runner"] == "trtexec"
    for r in cal.results:
        assert r.ok and r.runner == "trtexec" and r.golden["checked"] is False and r.stopped == "interval"
        # each query's time from the --exportTimes file: 5 runs first, then a block of 0.25 s at their mean (0.52 ms)
        assert [len(b.latencies_ms) for b in r.blocks] == [5, 481]
        assert r.blocks[1].latencies_ms[:3] == [0.5, 0.51, 0.52] and r.latency["count"] == 486
        assert r.latency["p90_ms"] == pytest.approx(0.58) and r.p90_interval_ms == (0.58, 0.59)
        assert r.load_s == pytest.approx(0.0033933)
    assert cal.result(3).rebuild_s is None and not isinstance(cal.result(12).rebuild_s, float)
    assert json.loads(out.read_text())["results"][0]["rebuild_s"] is None  # no rebuild ran on the device
    # trtexec opened exactly the verified artefacts, built with the profile's precision, for the runs asked
    opened = [line.split() for line in calls.read_text().splitlines()]
    assert sorted((words[-1], words[1:-2]) for words in opened) == sorted(
        (a.sha256, ["--fp16", f"--iterations={n}", "--duration=0", "--warmUp=200"]) for a in (small, large)
        for n in (5, 481))
    assert {Path(words[0].removeprefix("--onnx=")).name for words in opened} == {small.file, large.file}
    assert all(words[-2] == f"--exportTimes={words[0].removeprefix('--onnx=')}.times.json" for words in opened)
    pushed = {p.name for p in next((device / "bundles").iterdir()).iterdir()}
    assert pushed == {"manifest.json", small.file, large.file}  # no skeleton, recipe or golden pair
    assert not list(Path(tempfile.gettempdir()).glob("hydra-rebuilt-*"))  # the host's rebuilt copy is gone


# What a device sends that reaches the terminal: an OSC sequence that would set the terminal's title (ESC ] ... BEL),
# rich markup, and a newline that would forge a line of its own.
OSC = "\x1b]0;owned\x07[blink]x"
HOSTILE = OSC + "\nError: forged"
OSC_SHOWN = "\\x1b]0;owned\\x07[blink]x"
HOSTILE_SHOWN = OSC_SHOWN + "\\nError: forged"

# Stands between the runner and hydra-edge as a compromised or broken device would: its board name and its
# error text for 12 heads are HOSTILE, and its runtime chatter on stderr too.
HOSTILE_DEVICE = f"""\
import json, sys
hostile = {HOSTILE!r}
print("chatter " + {OSC!r}, file=sys.stderr, flush=True)  # a line of stderr ends at a newline: none here
for line in sys.stdin:
    event = json.loads(line) if line.startswith("{{") else None
    if isinstance(event, dict) and event.get("event") == "device":
        event["device"]["model"] = hostile
    elif isinstance(event, dict) and event.get("event") == "result" and event["heads"] == 12:
        event.update(status="error", latency=None, error="runtime failed: " + hostile)
    print(json.dumps(event) if isinstance(event, dict) else line, end="" if event is None else "\\n", flush=True)
"""


def test_what_the_device_sends_reaches_the_terminal_escaped_one_line_each(rpi_bundle: Path, device_python: Path,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A board's name, a runner's error text and its runtimes' chatter come from the device: printed as they
    are, an OSC sequence set the terminal's title and a newline forged an ``Error:`` line. Each is shown
    escaped (``terminal.shown``), on its own line, in the summary, the device's chatter (-v) and the error."""
    (tmp_path / "hostile.py").write_text(HOSTILE_DEVICE)
    device = tmp_path / "python-of-a-hostile-device"
    device.write_text(f'#!/bin/sh\ncase "$1" in\n  *runner.py) "{device_python}" "$@" | "{sys.executable}" '
                      f'"{tmp_path / "hostile.py"}"; exit 0;;\n  *) exec "{device_python}" "$@";;\nesac\n')
    device.chmod(0o755)
    monkeypatch.delenv(VERBOSE, raising=False)
    result = CliRunner().invoke(main, ["calibrate", "-v", "--bundle", str(rpi_bundle), "--local", "--python",
                                       str(device), "--out", str(tmp_path / "cal.json"), "--runs", "3",
                                       "--warmup", "0"])
    output = result.output
    assert result.exit_code == 1 and "Traceback" not in output, output
    assert not any(c in output for c in "\x1b\x07\x9b\x9d"), repr(output)  # no sequence a terminal obeys
    assert not any(line.startswith("Error: forged") for line in output.splitlines()), output
    # each is there, escaped and whole: the board's name in the table's title, the chatter, the error line
    assert output.count(HOSTILE_SHOWN) >= 2, output
    assert f": chatter {OSC_SHOWN}\n" in output, output
    assert f"\n12 heads: runtime failed: {HOSTILE_SHOWN}\n" in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("Error: 1 head count(s) failed: local:") and f"(runtime failed: {OSC_SHOWN}); " in last
    # the record keeps what the device said, as it said it
    assert read_calibration(tmp_path / "cal.json").device["model"] == HOSTILE


# --- the one line on a phone that gives no thermal headroom forecast ----------------------------------


def said_no_forecast(*states: object) -> list[str]:
    """What calibrate prints for results whose device states are ``states`` (the device's JSON, any shape)."""
    lines: list[str] = []
    session = SimpleNamespace(t=SimpleNamespace(device_id="adb:X1"), _said_no_forecast=False, echo=lines.append)
    for state in states:
        Session._say_no_forecast(session, HeadResult(heads=3, artefact="h3", sha256="0" * 64, status="ok",
                                                     runner="app", state_before=state))
    return lines


def test_a_failed_forecast_is_said_once_with_what_the_table_will_do() -> None:
    nan = {"errors": {"headroom": "getThermalHeadroom(10) answered NaN: the phone cannot forecast now"}}
    assert said_no_forecast(nan, nan) == [
        "adb:X1: no thermal headroom forecast (getThermalHeadroom(10) answered NaN: the phone cannot forecast now); "
        "unless it forecasts later in this calibration, its table will not use the forecast: it selects on the "
        "thermal status alone"]


@pytest.mark.parametrize("errors", [["headroom"], "headroom", 7, None, {"thermal": "no status"}, {"headroom": ""}])
def test_device_errors_of_any_other_shape_say_nothing(errors: object) -> None:
    assert said_no_forecast({"errors": errors}, "headroom", ["headroom"], None) == []


@pytest.mark.parametrize("why, shown", [("NaN\x1b[2J\u202e", "NaN\\x1b[2J\\u202e"), (["NaN", 1], "['NaN', 1]")])
def test_the_devices_words_are_shown_never_obeyed(why: object, shown: str) -> None:
    [line] = said_no_forecast({"errors": {"headroom": why}})
    assert f"no thermal headroom forecast ({shown}); " in line and line.isprintable()


def test_a_device_short_of_memory_is_told_once_and_still_measured(rpi_bundle: Path, device_python: Path,
                                                                    tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 1000000 kB\nMemAvailable: 50000 kB\n")
    out = tmp_path / "cal.json"
    result = invoke("--bundle", rpi_bundle, "--local", "--python", device_python, "--out", out, "--runs", 10,
                    "--warmup", 1, "--min-seconds", 0.2, "--cap-seconds", 2, "--sysfs-root", root)
    assert result.exit_code == 0, result.output
    assert result.output.count("its memory cannot hold every head count loaded (under 15% of it available)") == 1
    assert [r.heads for r in read_calibration(out).measured()] == [3, 12]
