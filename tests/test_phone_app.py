"""deploy --serial --apk and calibrate --runner app against the adb stand-in, driven by the real adb client.

The stand-in phone records every shell command and install it receives, and plays the app's side:
``adb install`` keeps the APK, ``pm path`` names it, ``am start ... --es mode bench`` writes bench
lines to the app's file under /sdcard as the app would. Those lines are the real calibration runner's
output (run here on the same bundle; ``runner`` set to ``"app"`` as the app writes it), never written
by hand, and the record the app path makes is compared with the one the Python-runner path makes
from the very same lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import msgspec
import pytest
from click.testing import CliRunner, Result
from support.adbd import AdbDevice, AdbServer, Phone, start_adbd
from support.compact import android_bundle
from support.processes import stop_process
from support.tables import fake_bundle

from hydra_edge.atomic import sha256_file
from hydra_edge.commands.calibrate import calibrate
from hydra_edge.commands.deploy import deploy
from hydra_edge.commands.lut import lut
from hydra_edge.lut.table import NO_FORECAST
from hydra_edge.measure.journal import read_calibration
from hydra_edge.measure.session import RoundsOptions
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.lut import read_table

pytestmark = pytest.mark.slow  # converts a .pte bundle, starts an adb server and a stand-in phone

RUNNER = Path(__file__).resolve().parents[1] / "calibration" / "runner.py"
PACKAGE = "org.hydraedge.demo"
COMPONENT = f"{PACKAGE}/.MainActivity"
BENCH_FILE = f"/sdcard/Android/data/{PACKAGE}/files/bench.jsonl"


# --- what the phone received ----------------------------------------------------------------------


def sent(phone: Phone) -> list[list[str]]:
    """Every shell command the phone received, as the argv the host meant: the host's wrapper that
    stops a command when the host goes (``sh -c CODE sh ARGV...``) taken off."""
    argvs = []
    for entry in phone.commands():
        if "shell" in entry:
            words = shlex.split(str(entry["shell"]))
            argvs.append(words[4:] if words[:2] == ["sh", "-c"] and words[3:4] == ["sh"] else words)
    return argvs


def installs(phone: Phone) -> list[dict[str, Any]]:
    return [entry for entry in phone.commands() if "abb_exec" in entry]


def one_line_error(result: Result) -> str:
    """The failed command's error: exactly one line, no traceback, non-zero exit."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    assert result.output.rstrip("\n").endswith(errors[0]), result.output  # nothing after it
    return errors[0]


@pytest.fixture(autouse=True)
def phone(adb_device: AdbDevice) -> Iterator[Phone]:
    """The stand-in's app side, empty: nothing installed, no answers set, no commands recorded."""
    phone = adb_device.phone
    phone.stop_app()
    if phone.dir.exists():
        shutil.rmtree(phone.dir)
    phone.dir.mkdir(parents=True)
    yield phone
    phone.stop_app()


# --- the bundle and the runner's lines --------------------------------------------------------------


def runner_lines(bundle: Path, *args: str) -> list[str]:
    """What calibration/runner.py prints for ``bundle``, as the app writes it: ``runner`` is ``"app"``, and
    lines are org.json's compact JSON."""
    done = subprocess.run([sys.executable, str(RUNNER), "--bundle", str(bundle), *args], capture_output=True,
                          text=True, timeout=600)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for event in events:  # the app follows the runner's plan, its lines the runner's
        if event.get("event") in ("result", "block"):
            event.update(runner="app")
    lines = [json.dumps(event, separators=(",", ":")) for event in events]
    assert lines, done.stdout + done.stderr
    return lines


@pytest.fixture(scope="module")
def pte_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A depth-1 digits model (random weights) converted for android: real .pte artefacts, 3 and 12 heads."""
    return android_bundle(tmp_path_factory.mktemp("android"), "full")


@pytest.fixture(scope="module")
def manifest_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of .pte records with no files: enough for the host (which reads only the manifest) and
    for the runner to say what it says about artefacts it cannot open."""
    folder = fake_bundle(tmp_path_factory.mktemp("pte") / "bundle", [3, 12])
    manifest = read_manifest(folder)
    records = [msgspec.structs.replace(a, format="executorch", file=a.file.replace(".onnx", ".pte"))
               for a in manifest.artefacts]
    msgspec.structs.replace(manifest, artefacts=records).write(folder)
    return folder


def installed(phone: Phone) -> None:
    """The demo app on the phone, as deploy leaves it."""
    phone.installed(PACKAGE).parent.mkdir(parents=True, exist_ok=True)
    phone.installed(PACKAGE).write_bytes(b"an installed app")


def bench(phone: Phone, lines: list[str]) -> None:
    """What the app writes in bench mode."""
    (phone.dir / "bench-lines").write_text("".join(line + "\n" for line in lines))


def calibrate_app(device: AdbDevice, bundle: Path, out: Path, *args: object) -> Result:
    return CliRunner().invoke(calibrate, [str(a) for a in ("--bundle", bundle, "--serial", device.serial,
                                                           "--adb-port", device.server.port, "--out", out, *args)])


def bench_start(runs: int, warmup: int, threads: int, bundle: Path, heads: tuple = (3, 12),
                first_round: int = 1) -> list[str]:
    """The ``am start`` of bench mode, timing the artefacts of ``heads`` only (``--esa only``), by calibrate's
    default plan with rounds numbered from ``first_round`` (``--es plan``)."""
    only = ",".join(a.id for a in read_manifest(bundle).artefacts if a.heads in heads)
    plan = json.dumps({**dataclasses.asdict(RoundsOptions()), "first_round": first_round}, separators=(",", ":"))
    return ["am", "start", "-S", "-n", COMPONENT, "--es", "mode", "bench", "--ei", "runs", str(runs),
            "--ei", "warmup", str(warmup), "--ei", "threads", str(threads), "--esa", "only", only, "--es", "plan", plan]


# --- calibrate --runner app ---------------------------------------------------------------------------


def test_the_apps_record_is_the_python_runners_for_the_same_lines(adb_device: AdbDevice, phone: Phone,
                                                                  pte_bundle: Path, tmp_path: Path) -> None:
    lines = runner_lines(pte_bundle, "--runs", "5", "--warmup", "1")
    installed(phone)
    bench(phone, lines)
    app = calibrate_app(adb_device, pte_bundle, tmp_path / "app.json", "--runner", "app", "--runs", 5,
                        "--warmup", 1)
    assert app.exit_code == 0, app.output
    commands = sent(phone)
    start = bench_start(5, 1, 0, pte_bundle)
    assert ["rm", "-f", BENCH_FILE] in commands and start in commands and ["cat", BENCH_FILE] in commands
    assert commands.index(["rm", "-f", BENCH_FILE]) < commands.index(start) < commands.index(["cat", BENCH_FILE])
    assert not installs(phone) and not any(c[:1] == ["sha256sum"] for c in commands)  # the APK carries the bundle
    assert ["am", "force-stop", PACKAGE] not in commands  # it finished: left showing its summary
    # the runner read the profile's headroom command where there is none (as a phone before Android 14): said once
    note = (f"adb:{adb_device.serial}: no thermal headroom forecast "
            "(`cmd thermalservice headroom 10` failed or printed nothing)")
    assert app.output.count(note) == 1 and "its table will not use the forecast" in app.output

    # The Python runner's path over the same phone, its runner printing exactly the same lines.
    (tmp_path / "lines").write_text("".join(line + "\n" for line in lines))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ncase "$1" in */runner.py) exec cat {shlex.quote(str(tmp_path / "lines"))} ;; '
                      f'esac\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    runner = calibrate_app(adb_device, pte_bundle, tmp_path / "python.json", "--python", python, "--runs", 5,
                           "--warmup", 1)
    assert runner.exit_code == 0, runner.output

    by_app, by_runner = read_calibration(tmp_path / "app.json"), read_calibration(tmp_path / "python.json")
    assert by_app.settings == {**by_runner.settings, "runner": "app"} and by_runner.settings["runner"] == "python"
    assert by_app.settings["rounds"]["within"] == 0.05  # both time by the same plan
    assert msgspec.structs.replace(by_app, settings=by_runner.settings) == by_runner
    assert [r.heads for r in by_app.measured()] == [3, 12] and {r.runner for r in by_app.results} == {"app"}
    assert by_app.device_id == f"adb:{adb_device.serial}" and by_app.device["runtimes"]

    # lut reads it as any calibration
    made = CliRunner().invoke(lut, ["--bundle", str(pte_bundle), "--calibration", str(tmp_path / "app.json"),
                                    "--budget-ms", "1000", "--out", str(tmp_path / "lut")])
    assert made.exit_code == 0, made.output
    # the profile names headroom but the phone never forecast: the table leaves it out, and says so once
    assert made.output.count(f"{NO_FORECAST}\n") == 1
    assert read_table(tmp_path / "lut" / "lut.json", pte_bundle).thermal_headroom is False
    table = json.loads((tmp_path / "lut" / "lut.json").read_text())
    assert table["bundle"]["manifest_sha256"] == sha256_file(pte_bundle / "manifest.json")


def test_the_apps_settings_are_the_ones_asked(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                             tmp_path: Path) -> None:
    """Runs, warm-up and threads reach the app as its extras; the runner's lines for a bundle whose files
    it cannot open are recorded as the errors they are, and the command says so."""
    installed(phone)
    bench(phone, runner_lines(manifest_only, "--runs", "7", "--warmup", "3", "--threads", "2"))
    result = calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app", "--runs", 7,
                           "--warmup", 3, "--threads", 2)
    line = one_line_error(result)
    assert "2 head count(s) failed" in line and "missing or its sha256 differs" in line
    assert bench_start(7, 3, 2, manifest_only) in sent(phone)
    record = read_calibration(tmp_path / "cal.json")
    assert [r.status for r in record.results] == ["error", "error"] and record.settings["runner"] == "app"


def test_a_block_for_a_head_count_already_measured_is_refused_and_its_result_kept(
        adb_device: AdbDevice, phone: Phone, pte_bundle: Path, tmp_path: Path) -> None:
    """A device that sends more runs of a head count after its result (a foreign or broken runner) is one line;
    the measured result is never turned back into one still timing."""
    lines = runner_lines(pte_bundle, "--runs", "5", "--warmup", "1")
    first = next(i for i, x in enumerate(lines) if json.loads(x)["event"] == "result")
    heads = json.loads(lines[first])["heads"]
    again = next(x for x in lines if json.loads(x)["event"] == "block" and json.loads(x)["heads"] == heads)
    installed(phone)
    bench(phone, [*lines[:first + 1], again, *lines[first + 1:]])
    out = tmp_path / "cal.json"
    line = one_line_error(calibrate_app(adb_device, pte_bundle, out, "--runner", "app", "--runs", 5, "--warmup", 1))
    assert f"sent a block of runs for {heads} heads, which {out} holds measured" in line
    assert read_calibration(out).result(heads).status == "ok"


def test_a_fatal_line_is_one_line_and_stops_the_app(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                     tmp_path: Path) -> None:
    installed(phone)
    fatal = runner_lines(tmp_path / "no-such-bundle")  # what the runner says when it cannot read its bundle
    assert [json.loads(x)["event"] for x in fatal] == ["fatal"]
    bench(phone, fatal)
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app"))
    assert json.loads(fatal[0])["message"] in line and f"adb:{adb_device.serial}" in line
    assert ["am", "force-stop", PACKAGE] in sent(phone)


def test_a_silent_app_times_out_in_one_line(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                            tmp_path: Path) -> None:
    installed(phone)
    bench(phone, runner_lines(manifest_only)[:1])  # its device line, then nothing
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app",
                                        "--app-timeout", 2))
    assert "the app wrote no line to " + BENCH_FILE + " for 2 s" in line and "0 of 2 head counts are saved" in line
    assert ["am", "force-stop", PACKAGE] in sent(phone)


def test_a_resumed_calibration_has_the_app_time_only_what_the_record_lacks(
        adb_device: AdbDevice, phone: Phone, pte_bundle: Path, tmp_path: Path) -> None:
    lines = runner_lines(pte_bundle, "--runs", "5", "--warmup", "1")
    installed(phone)
    first_result = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "result")
    bench(phone, lines[:first_result + 1])  # rounds until one head count's result, then it hangs
    out = tmp_path / "cal.json"
    line = one_line_error(calibrate_app(adb_device, pte_bundle, out, "--runner", "app", "--runs", 5, "--warmup", 1,
                                        "--app-timeout", 2))
    assert "1 of 2 head counts are saved" in line and bench_start(5, 1, 0, pte_bundle) in sent(phone)
    done = read_calibration(out).measured()[0]
    first, left = done, 15 - done.heads  # the head count that finished first (3 or 12), and the other
    after = 1 + max(r.round for r in read_calibration(out).rounds)

    given = tmp_path / "resume.json"  # what the app does when asked for the other head count from round `after`
    given.write_text(json.dumps({"first_round": after, "blocks": {}}))
    left_id = next(a.id for a in read_manifest(pte_bundle).artefacts if a.heads == left)
    bench(phone, runner_lines(pte_bundle, "--runs", "5", "--warmup", "1", "--only", left_id, "--resume", str(given)))
    phone.dir.joinpath("commands.jsonl").unlink()
    resumed = calibrate_app(adb_device, pte_bundle, out, "--runner", "app", "--runs", 5, "--warmup", 1)
    assert resumed.exit_code == 0, resumed.output
    assert [c for c in sent(phone) if c[:2] == ["am", "start"]] == [bench_start(5, 1, 0, pte_bundle, heads=(left,),
                                                                                first_round=after)]
    written = phone.bench_file(PACKAGE).read_text().splitlines()
    assert [json.loads(x).get("heads") for x in written if json.loads(x)["event"] == "result"] == [left]
    record = read_calibration(out)
    assert [r.heads for r in record.measured()] == [3, 12] and record.result(first.heads) == first
    # the blocks the hung run left for it were dropped: its result holds the second run's blocks alone
    assert [b.round for b in record.result(left).blocks] == [json.loads(x)["block"]["round"] for x in written
                                                              if json.loads(x)["event"] == "block"]


def test_an_app_that_dies_is_one_line_within_seconds_not_at_the_timeout(
        adb_device: AdbDevice, phone: Phone, pte_bundle: Path, tmp_path: Path) -> None:
    lines = runner_lines(pte_bundle, "--runs", "5", "--warmup", "1")
    installed(phone)
    second = [i for i, x in enumerate(lines) if json.loads(x)["event"] == "round"][1]
    order = json.loads(lines[second])["order"]
    assert sorted(order) == [3, 12]  # neither has stopped after one round
    bench(phone, lines[:second + 1])  # a round timed, the next begun, then the process is gone (a crash)
    (phone.dir / "bench-end").write_text("exits")
    began = time.monotonic()
    line = one_line_error(calibrate_app(adb_device, pte_bundle, tmp_path / "cal.json", "--runner", "app",
                                        "--runs", 5, "--warmup", 1))  # --app-timeout: its 600 s default
    assert time.monotonic() - began < 60
    culprit = next(a for a in read_manifest(pte_bundle).artefacts if a.heads == order[0])  # the round's first
    assert f"the demo app died on adb:{adb_device.serial} while timing {culprit.heads} heads ({culprit.id}); " in line
    assert f"`adb -P {adb_device.server.port} -s {adb_device.serial} logcat -d -s hydra-edge AndroidRuntime:E` " \
           "shows why" in line
    assert ["pidof", PACKAGE] in sent(phone) and ["am", "force-stop", PACKAGE] in sent(phone)
    record = read_calibration(tmp_path / "cal.json")  # the culprit crashed, its blocks kept; the other still timing
    assert {r.heads: r.status for r in record.results} == {order[0]: "crashed", order[1]: "timing"}
    assert all(len(r.blocks) == 1 for r in record.results)


def test_a_line_caught_mid_write_is_read_once_whole(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                    tmp_path: Path) -> None:
    """The app's every line is flushed in two halves 1.5 s apart, so the host's reads (every 0.5 s) find half
    lines: none is parsed until its newline, and none is lost."""
    installed(phone)
    lines = runner_lines(manifest_only, "--runs", "7")
    bench(phone, lines)
    (phone.dir / "bench-torn").write_text("1.5")
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app",
                                        "--runs", 7, "--app-timeout", 30))  # a line lost waits no longer
    assert "2 head count(s) failed" in line and "missing or its sha256 differs" in line
    record = read_calibration(tmp_path / "cal.json")
    assert [(r.heads, r.status) for r in record.results] == [(3, "error"), (12, "error")]
    first = json.loads(lines[0])
    assert first["event"] == "device" and record.device["runtimes"] == first["runtimes"]  # the device line, whole


def test_an_app_slow_to_start_is_not_taken_for_dead(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                   tmp_path: Path) -> None:
    """An app whose process shows, and whose first line comes, only 3 s after ``am start`` (the host's first
    ask, 2 s in, finds none; a second would come 4 s in) is timed to the end, not declared dead at that miss."""
    installed(phone)
    bench(phone, runner_lines(manifest_only))
    (phone.dir / "start-s").write_text("3")
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app"))
    assert "2 head count(s) failed" in line and "died" not in line
    answers = [entry["pidof"] for entry in phone.commands() if "pidof" in entry]
    assert answers[:1] == ["none"], answers  # asked while the app was starting, and not taken for dead
    assert [r.status for r in read_calibration(tmp_path / "cal.json").results] == ["error", "error"]


def test_an_app_built_from_another_bundle_is_refused(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                     tmp_path: Path) -> None:
    installed(phone)
    other = fake_bundle(tmp_path / "other", [3, 12])
    records = [msgspec.structs.replace(a, sha256="9" * 64) for a in read_manifest(other).artefacts]
    msgspec.structs.replace(read_manifest(other), artefacts=records).write(other)
    bench(phone, runner_lines(other))
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app"))
    assert "carries another bundle than" in line and "999999999999" in line
    assert ["am", "force-stop", PACKAGE] in sent(phone)


def test_an_app_that_is_not_installed_says_to_deploy_it(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                        tmp_path: Path) -> None:
    line = one_line_error(calibrate_app(adb_device, manifest_only, tmp_path / "cal.json", "--runner", "app"))
    assert f"the demo app ({PACKAGE}) is not installed" in line
    assert f"hydra-edge deploy --serial {adb_device.serial} --apk" in line


def test_the_app_is_refused_for_other_formats_and_devices(adb_device: AdbDevice, phone: Phone, tmp_path: Path) -> None:
    onnx = fake_bundle(tmp_path / "onnx", [3])
    line = one_line_error(calibrate_app(adb_device, onnx, tmp_path / "cal.json", "--runner", "app"))
    assert "runs .pte artefacts" in line and "onnx" in line
    result = CliRunner().invoke(calibrate, ["--bundle", str(onnx), "--local", "--runner", "app"])
    assert result.exit_code == 2 and "name it with --serial" in result.output
    assert all(c[:2] != ["am", "start"] for c in sent(phone))


# --- deploy --serial --apk ----------------------------------------------------------------------------


def demo_apk(path: Path, bundle: Path) -> Path:
    """An APK-shaped zip as android-app lays it out (its manifest, its bundle and table as assets)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("AndroidManifest.xml", b"\x03\x00\x08\x00" + bytes(range(256)))
        z.writestr("classes.dex", b"dex\n035\x00" + bytes(4096))
        z.write(bundle / "manifest.json", "assets/bundle/manifest.json")
        z.writestr("assets/lut.json", "{}")
    return path


def deploy_phone(device: AdbDevice | AdbServer, apk: Path, serial: str | None = None) -> Result:
    server = device.server if isinstance(device, AdbDevice) else device
    serial = serial or (device.serial if isinstance(device, AdbDevice) else "")
    return CliRunner().invoke(deploy, ["--serial", serial, "--apk", str(apk), "--adb-port", str(server.port)])


def test_deploy_installs_the_checked_apk_and_starts_the_app(adb_device: AdbDevice, phone: Phone,
                                                             manifest_only: Path, tmp_path: Path) -> None:
    apk = demo_apk(tmp_path / "demo.apk", manifest_only)
    result = deploy_phone(adb_device, apk)
    assert result.exit_code == 0, result.output
    digest = hashlib.sha256(apk.read_bytes()).hexdigest()
    assert installs(phone) == [{"abb_exec": ["package", "install", "-r", "-S", str(apk.stat().st_size)],
                                "bytes": apk.stat().st_size, "sha256": digest}]
    assert phone.installed(PACKAGE).read_bytes() == apk.read_bytes()
    commands = sent(phone)
    base = f"/data/app/{PACKAGE}/base.apk"
    assert ["pm", "path", PACKAGE] in commands and ["sha256sum", "--", base] in commands
    assert commands[-1] == ["am", "start", "-n", COMPONENT]  # started last, once the install was proved
    assert digest[:12] in result.output and f"started {COMPONENT}" in result.output


@pytest.mark.parametrize("case", ["install refused", "wrong package", "another package beside the app",
                                  "not the demo app", "no device"])
def test_deploy_failures_are_one_line_and_start_nothing(adb_device: AdbDevice, phone: Phone, manifest_only: Path,
                                                        tmp_path: Path, case: str) -> None:
    apk = demo_apk(tmp_path / "demo.apk", manifest_only)
    serial = None
    if case == "install refused":
        (phone.dir / "install-answer").write_text(
            f"Failure [INSTALL_FAILED_UPDATE_INCOMPATIBLE: Package {PACKAGE} signatures do not match "
            "previously installed version; ignoring!]")
    elif case in ("wrong package", "another package beside the app"):
        (phone.dir / "apk-package").write_text("org.example.other")
        if case == "another package beside the app":
            installed(phone)  # the demo app of an earlier deploy: its base.apk has a digest, not this APK's
    elif case == "not the demo app":
        with zipfile.ZipFile(apk, "w") as z:
            z.writestr("AndroidManifest.xml", b"\x03\x00\x08\x00")
    else:
        serial = "127.0.0.1:9"
    result = deploy_phone(adb_device, apk, serial)
    line = one_line_error(result)
    expected = {"install refused": "refused to install demo.apk: INSTALL_FAILED_UPDATE_INCOMPATIBLE",
                "wrong package": f"not as {PACKAGE}: it is another app's package",
                "another package beside the app": f"{PACKAGE} on adb:{adb_device.serial} is not demo.apk (sha256 "
                                                  f"{hashlib.sha256(b'an installed app').hexdigest()[:12]}... there",
                "not the demo app": "is not the hydra-edge demo app (it carries no bundle)",
                "no device": "127.0.0.1:9 is not connected"}[case]
    assert expected in line
    if case == "install refused":
        assert f"uninstall {PACKAGE}" in line and not phone.installed(PACKAGE).exists()
    if case == "not the demo app":
        assert phone.commands() == []  # refused before the phone was asked anything
    if case == "another package beside the app":  # the demo app is the earlier one, and it was not started
        assert phone.installed(PACKAGE).read_bytes() == b"an installed app"
        assert "checked on the phone" not in result.output and phone.installed("org.example.other").is_file()
    assert all(c[:2] != ["am", "start"] for c in sent(phone))


def test_an_offline_phone_is_one_line_for_deploy_and_calibrate(adb_server: AdbServer, manifest_only: Path,
                                                               tmp_path: Path) -> None:
    phone = start_adbd(tmp_path / "offline", adb_server, serial="OFFLINE1")
    try:
        stop_process(phone.process)  # the server keeps it listed, offline
        for _ in range(100):
            if f"{phone.serial}\toffline" in adb_server.adb("devices").stdout:
                break
            time.sleep(0.1)
        apk = demo_apk(tmp_path / "demo.apk", manifest_only)
        line = one_line_error(deploy_phone(phone, apk))
        assert f"adb:{phone.serial} is offline" in line
        line = one_line_error(calibrate_app(phone, manifest_only, tmp_path / "cal.json", "--runner", "app"))
        assert f"adb:{phone.serial} is offline" in line
    finally:
        phone.stop()


@pytest.fixture
def no_device_contacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy must decide without a device: opening one fails the test."""
    from hydra_edge.transport import DeviceArg

    def contacted(self: DeviceArg, options: dict[str, Any]) -> None:
        raise AssertionError(f"{self.kind} {self.name} was contacted")

    monkeypatch.setattr(DeviceArg, "open", contacted)


def test_deploy_apk_without_a_phone_named_asks_for_serial_only(no_device_contacted: None, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """--apk installs over adb: with no --serial and no ANDROID_SERIAL the line names --serial and adb, never an
    ssh host or --local, which --apk cannot use."""
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text("{}")
    result = CliRunner().invoke(deploy, ["--apk", str(demo_apk(tmp_path / "demo.apk", tmp_path / "bundle"))])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "--serial" in line and "adb devices" in line and "ANDROID_SERIAL" in line
    assert "ssh" not in result.output and "local" not in result.output, result.output


@pytest.mark.parametrize("case", ["not a zip", "no bundle inside", "missing"])
def test_a_bad_apk_is_one_line_before_any_phone_is_contacted(no_device_contacted: None, tmp_path: Path,
                                                             case: str) -> None:
    apk = tmp_path / "demo.apk"
    if case == "not a zip":
        apk.write_text("not an APK\n")
    elif case == "no bundle inside":
        with zipfile.ZipFile(apk, "w") as z:
            z.writestr("AndroidManifest.xml", b"\x03\x00\x08\x00")
    result = CliRunner().invoke(deploy, ["--serial", "R58M12345", "--apk", str(apk)])
    assert "was contacted" not in str(result.exception), result.exception
    if case == "missing":  # click's own check of the option
        assert result.exit_code == 2 and "does not exist" in result.output.strip().splitlines()[-1]
        return
    line = one_line_error(result)
    assert str(apk) in line and "hydra-edge android-app" in line
    assert {"not a zip": "is not an APK", "no bundle inside": "is not the hydra-edge demo app"}[case] in line


def test_deploy_options_for_a_board_and_a_phone_do_not_mix(manifest_only: Path, tmp_path: Path) -> None:
    apk = demo_apk(tmp_path / "demo.apk", manifest_only)
    mixed = CliRunner().invoke(deploy, ["--apk", str(apk), "--serial", "X", "--host", "pi@board", "--camera", "0"])
    assert mixed.exit_code == 2 and "drop --host, --camera" in mixed.output
    no_apk = CliRunner().invoke(deploy, ["--serial", "X"])
    assert no_apk.exit_code == 2 and "give --apk" in no_apk.output
    board = CliRunner().invoke(deploy, ["--host", "pi@board", "--images", str(tmp_path)])
    assert board.exit_code == 2 and "Missing option '--bundle'" in board.output
