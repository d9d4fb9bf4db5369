"""The board demo app and `hydra-edge deploy`: a real bundle and table, a scripted day, a loopback board."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from support.boards import start_host, stop_host_and_check_the_board
from support.demo_board import table_for
from support.processes import free_port
from support.pythons import torch_free_python
from support.sshd import SshServer

from hydra_edge.commands.demo import scenario_steps
from hydra_edge.commands.deploy import APP, deploy, local_state
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.terminal import shown

pytestmark = pytest.mark.slow  # converts a bundle, runs the board app, deploys over sshd

ROOT = Path(__file__).resolve().parents[1]


def test_app_follows_a_scripted_day(board: dict[str, Path], tmp_path: Path) -> None:
    """Hot and low battery take heads away, cool and charging give them back; every switch is logged."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"steps": scenario_steps(images_per_step=3)}))
    log = tmp_path / "events.json"
    proc = subprocess.run(
        [sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--images",
         str(board["images"]), "--scenario", str(scenario), "--sysfs-root", str(tmp_path / "sysfs"), "--threads", "1",
         "--plain", "--log", str(log)],
        capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    events = json.loads(log.read_text())["events"]
    path = [e["to"] for e in events]
    assert path[0] == 12 and events[0]["reason"] == "start"  # on the charger, cool
    assert min(path) == 3 and path[-1] == 12  # very hot or low battery: 3 heads; back on the charger: 12 again
    down = {(round(e["reading"]["thermal"]), round(e["reading"]["battery_pct"])) for e in events if e["to"] == 3}
    assert down == {(84, 68), (50, 18)}  # very hot at 68 % battery; nearly empty when cool
    lines = [line for line in proc.stdout.splitlines() if line.startswith("switch ")]
    assert len(lines) == len(events) and "-> 12 heads [start]" in lines[0] and "92.0% held-out top-1" in lines[0]


def test_deploy_over_ssh_pushes_and_runs_the_app(board: dict[str, Path], sshd_server: SshServer,
                                                 tmp_path: Path) -> None:
    remote = tmp_path / "pi home; it's \"here\""
    python = torch_free_python(tmp_path / "py")
    args = ["--bundle", board["bundle"], "--lut", board["lut"].parent, "--host", sshd_server.spec,
            "--identity", sshd_server.identity_file, "--known-hosts", sshd_server.known_hosts,
            "--remote-dir", remote, "--images", board["images"], "--max-images", 12, "--python", python]
    result = CliRunner().invoke(deploy, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    # the heads this machine's own sensors allow: where they cannot be read, the smallest (fail-safe)
    start = re.search(r"switch None -> (\d+) heads \[start", result.output)
    assert start, result.output
    ran = f"{start.group(1)} heads: 12 images"
    assert ran in result.output
    assert (remote / "app" / "bundle" / "lut.json").read_bytes() == board["lut"].read_bytes()
    # one weight set on the board: the 12-head file, skeletons and recipes for 3 and 6, never their files
    on_board = {p.name for p in (remote / "app" / "bundle").iterdir()}
    small = [a for a in read_manifest(board["bundle"]).artefacts if a.compact is not None]
    assert [a.heads for a in small] == [3, 6] and not on_board & {a.file for a in small}
    assert {a.compact.recipe for a in small} <= on_board and "vit_h12_onnx_fp32.onnx" in on_board
    assert (remote / "app" / "images" / "2" / "3.png").is_file()
    again = CliRunner().invoke(deploy, [str(a) for a in args])
    assert again.exit_code == 0 and "0 of " in again.output  # nothing re-sent

    detached = CliRunner().invoke(deploy, [str(a) for a in args + ["--detach"]])
    assert detached.exit_code == 0, detached.output
    log = remote / "app" / "app.log"
    for _ in range(600):
        if log.is_file() and ran in log.read_text():  # the totals, printed after the last summary line
            break
        time.sleep(0.1)
    assert ran in log.read_text()


def test_deploy_local_runs_this_interpreter_from_a_folder_that_outlives_it(board: dict[str, Path], tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """calibrate --local's interpreter, and a log that is still there once deploy has returned."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    result = CliRunner().invoke(deploy, ["--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--local",
                                         "--images", str(board["images"]), "--max-images", "4", "--detach"])
    assert result.exit_code == 0, result.output
    log = tmp_path / "data" / "hydra-edge" / "local-board" / "app" / "app.log"
    assert f"its output goes to {log}" in result.output
    for _ in range(600):
        if log.is_file() and "4 images" in log.read_text():
            break
        time.sleep(0.1)
    assert "4 images" in log.read_text()


def test_deploy_local_says_what_it_keeps_and_fresh_removes_a_saved_correction(
        board: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy --local keeps the board's files under the user's data folder between runs, and with them the
    latency correction an earlier run saved, which caps the next start: it says where, how big, how old the
    correction is and what it does, and how to clear them; --fresh removes the correction."""
    from hydra_edge.records import correction

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    folder = tmp_path / "data" / "hydra-edge" / "local-board"
    args = ["--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--local", "--images", str(board["images"]),
            "--max-images", "2"]
    first = CliRunner().invoke(deploy, args)
    assert first.exit_code == 0, first.output
    assert f"local board: its files go to {folder}, kept between runs (rm -r it to remove them)" in first.output

    saved, planted = folder / "app" / "bundle" / "lut.correction.json", time.time() - 300
    saved.write_bytes(correction.encode(correction.CorrectionDocument(
        created_by="an earlier run", saved_at=planted, manifest_sha256="0" * 64, lut_sha256="0" * 64, budget_ms=10.0,
        learned=[correction.LearnedLatency(heads=12, p90_ms=30.0, slowdown=3.0, samples=100)]), str(saved)))
    again = CliRunner().invoke(deploy, args)
    assert again.exit_code == 0, again.output
    said = re.search(rf"^local board: {re.escape(str(folder))} holds ([\d.]+) MB kept between runs \(the app, the "
                     rf"bundle, the images\), and the latency correction {re.escape(str(saved))}, saved (\d+) s ago: "
                     r"for 3600 s after it was saved it caps the head count the app starts with; --fresh removes it, "
                     r"rm -r the folder removes everything$", again.output, re.M)
    assert said and float(said.group(1)) > 0 and 300 <= int(said.group(2)) < 600, again.output

    fresh = CliRunner().invoke(deploy, [*args, "--fresh"])
    assert fresh.exit_code == 0, fresh.output
    assert f"--fresh: the latency correction {saved} is removed, the app starts from the table" in fresh.output
    assert not saved.exists() or correction.read(saved).saved_at != planted  # gone (or learned anew by this run)


def test_deploy_local_says_its_line_when_a_file_goes_while_it_looks(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached app from an earlier deploy may still run from the folder, rotating app.log and renaming its
    correction as it saves it: a file gone between the listing and its size is left out, never a traceback."""
    folder = tmp_path / "local-board"
    (folder / "app" / "bundle").mkdir(parents=True)
    (folder / "app" / "app.log").write_bytes(b"x" * 2_000_000)
    (folder / "app" / "bundle" / "model.onnx").write_bytes(b"\0" * 1_000_000)
    listed = Path.is_file

    def listed_then_gone(path: Path) -> bool:
        found = listed(path)
        if found and path.name == "app.log":
            path.unlink()
        return found

    monkeypatch.setattr(Path, "is_file", listed_then_gone)
    assert local_state(folder, fresh=False) == (f"local board: {folder} holds 1.0 MB kept between runs (the app, "
                                                "the bundle, the images); rm -r it to remove them")


def test_deploy_refuses_a_table_of_another_bundle(board: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    table = json.loads(board["lut"].read_text())
    table["bundle"]["manifest_sha256"] = "0" * 64
    other.write_text(json.dumps(table))
    result = CliRunner().invoke(deploy, ["--bundle", str(board["bundle"]), "--lut", str(other), "--local",
                                         "--images", str(board["images"]), "--remote-dir", str(tmp_path / "dev")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "Error:" in result.output and not (tmp_path / "dev" / "app").exists()


@pytest.mark.parametrize("names", [["zéro", 'un "1"', "deux\\2", "trois", "quatre", "cinq", "six", "sept", "huit",
                                    "neuf"], None], ids=["named", "unnamed"])
def test_app_prints_each_predicted_class_by_name_or_else_by_index(board: dict[str, Path], tmp_path: Path,
                                                                 names: list[str] | None) -> None:
    """A person reads what the board sees: the bundle's class names when it has them, logit indices otherwise."""
    bundle = tmp_path / "bundle"
    shutil.copytree(board["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["classes"] = names
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    lut = table_for(bundle, tmp_path)
    labels = names or [str(i) for i in range(10)]
    for label in labels[:3]:
        shutil.copytree(board["images"] / "0", tmp_path / "images" / label)
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(bundle), "--lut", str(lut), "--images",
                           str(tmp_path / "images"), "--plain", "--each-image", "--max-images", "12", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("image ")]
    said = [re.fullmatch(r"image (\d+): (.+?) \((\d+) heads, [\d.]+ ms(, labelled (.+))?\)", line) for line in lines]
    assert len(lines) == 12 and all(said), proc.stdout
    assert [int(m.group(1)) for m in said] == list(range(1, 13))
    assert all(m.group(2) in labels for m in said)
    # a folder's labels are known only by name: without names the app cannot tell which folder is which class
    assert {m.group(5) for m in said} == (set(labels[:3]) if names else {None})


@pytest.mark.parametrize("case, message", [
    ("unknown class", "is not one of the model's classes"),
    ("bad scenario", "step 1 needs temp_c and battery_pct"),
    ("unwritable runtime log", "cannot write the runtime log"),
])
def test_app_mistakes_are_one_line(board: dict[str, Path], tmp_path: Path, case: str, message: str) -> None:
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(images / "cat" / "a.png")
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"steps": [{"battery_pct": 50}]}))
    (tmp_path / "a-file").write_text("a file where the log's folder must go")
    args = {"unknown class": ["--images", str(images)],
            "bad scenario": ["--images", str(board["images"]), "--scenario", str(scenario),
                             "--sysfs-root", str(tmp_path / "sys")],
            "unwritable runtime log": ["--images", str(images), "--runtime-log", str(tmp_path / "a-file" / "x.log")],
            }[case]
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]),
                           "--plain", "--max-images", "1", *args],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and message in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()][-1].startswith("Error: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("damaged", ["manifest.json", "lut.json"])
def test_one_byte_of_invalid_utf8_in_a_record_is_one_line_not_a_traceback(board: dict[str, Path], tmp_path: Path,
                                                                          damaged: str) -> None:
    """A manifest that cannot be read stops the app in one line; a table that cannot be read is one warning
    line and the smallest head count runs (the switcher's fallback)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(board["bundle"], bundle)
    lut = tmp_path / "lut.json"
    shutil.copy(board["lut"], lut)
    path = bundle / "manifest.json" if damaged == "manifest.json" else lut
    path.write_bytes(path.read_bytes().replace(b'"schema": "hydra-edge/', b'"schema": "hydra-edge\xff/', 1))
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(bundle), "--lut", str(lut), "--plain",
                           "--max-images", "1", "--images", str(board["images"])],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "not valid UTF-8" in line]
    assert len(said) == 1 and str(path) in said[0], proc.stderr[-3000:]
    if damaged == "manifest.json":
        assert proc.returncode == 1 and said[0].startswith("Error: ")
    else:
        assert proc.returncode == 0 and "running the smallest head count" in said[0], said


def run_app(board: dict[str, Path], *args: object, site: Path | None = None) -> subprocess.CompletedProcess:
    """The app as a board runs it; ``site`` is a folder of its Python's own (e.g. a sitecustomize)."""
    path = f"{site}:{ROOT}" if site else str(ROOT)
    return subprocess.run([sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]),
                           "--plain", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"})


def test_the_app_without_its_runtime_stops_in_one_line(board: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['onnxruntime'] = None\n")
    proc = run_app(board, "--images", board["images"], "--max-images", 3, site=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "switch" not in proc.stdout
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith("Error: this device lacks the Python package(s) onnxruntime") and "-m pip install" in line


def test_an_unreadable_image_is_skipped_with_one_warning(board: dict[str, Path], tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "1").mkdir(parents=True)
    for name in ("a.png", "c.png"):
        Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(images / "1" / name)
    (images / "1" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    proc = run_app(board, "--images", images, "--max-images", 4)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "b.png" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipped") and "Traceback" not in proc.stderr
    assert "4 images" in proc.stdout  # the two readable images, cycled
    # the app's own warnings stay on the terminal; what the runtime prints goes to the log it names
    log = board["bundle"] / "logs" / "runtime.log"
    assert f"runtime output: {log}" in proc.stdout and log.read_text().startswith("# board demo app")


def test_deploy_shows_the_apps_warnings_as_they_happen(board: dict[str, Path], tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "1").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(images / "1" / "a.png")
    (images / "1" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    result = CliRunner().invoke(deploy, ["--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--local",
                                         "--images", str(images), "--max-images", "3", "--python", sys.executable,
                                         "--remote-dir", str(tmp_path / "dev")])
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if line.startswith("warning: skipped") and "b.png" in line]
    assert len(skipped) == 1, result.output
    assert "3 images" in result.output


NATIVE_LINE = "[cpuinfo_utils.cpp:71] Reading file /sys/devices/system/cpu/cpu0/regs/identification/midr_el1"
LIBRARY_WARNING = "torch.utils._pytree._register_pytree_node is deprecated"


def chatty_runtime(site: Path, load_s: float) -> Path:
    """A Python site under which each model load prints as ExecuTorch and torch do (C stdio on descriptor 1,
    a write to descriptor 2, a Python ``FutureWarning``) and takes ``load_s`` seconds; returns the folder."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(f"""
import ctypes, os, time, warnings
import hydra_edge.runtime.switcher as switcher
real, libc = switcher.load_record, ctypes.CDLL(None)
def load_record(*args, **kwargs):
    libc.printf(b"{NATIVE_LINE}\\n")
    libc.fflush(None)
    os.write(2, b"E native stderr of the runtime\\n")
    warnings.warn("{LIBRARY_WARNING}", FutureWarning)
    time.sleep({load_s})
    return real(*args, **kwargs)
switcher.load_record = load_record
""")
    return site


def test_deploy_local_keeps_what_the_runtimes_print_off_the_terminal(board: dict[str, Path], tmp_path: Path) -> None:
    """What a runtime's native code prints (on either descriptor) and a library's Python warnings go to the
    app's runtime log, which deploy names; the terminal keeps the app's own lines."""
    site = chatty_runtime(tmp_path / "site", load_s=0)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    result = CliRunner().invoke(deploy, ["--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--local",
                                         "--images", str(board["images"]), "--max-images", "3", "--python",
                                         str(python), "--remote-dir", str(tmp_path / "dev")])
    assert result.exit_code == 0, result.output
    assert "3 images" in result.output and "cpuinfo" not in result.output and "_pytree" not in result.output
    assert "native stderr" not in result.output, result.output
    log = tmp_path / "dev" / "app" / "bundle" / "logs" / "runtime.log"
    assert f"runtime output: {log}" in result.output
    kept = log.read_text()
    assert NATIVE_LINE in kept and "native stderr" in kept and f"FutureWarning: {LIBRARY_WARNING}" in kept, kept


# the plain output's summary line: images, heads, p50, p90, live top-1 (labelled images only), switches
SUMMARY = re.compile(r"\d+ s: (\d+) images \([\d.]+/s\), (3|6|12) heads, p50 ([\d.]+) ms, p90 ([\d.]+) ms, "
                     r"(?:live top-1 ([\d.]+)%, )?(\d+) switches, last \d")


def summary_lines(stdout: str) -> list[re.Match]:
    """The plain output's summary lines, parsed."""
    return [m for m in map(SUMMARY.fullmatch, stdout.splitlines()) if m]


def test_the_summary_latency_leaves_the_model_load_out(board: dict[str, Path], tmp_path: Path) -> None:
    """A model that takes seconds to load: the first summary, due once it has loaded, gives the inference's
    latency, not the load's."""
    site = chatty_runtime(tmp_path / "site", load_s=2.0)
    proc = run_app(board, "--images", board["images"], "--max-images", 6, "--summary-s", 0.5, "--threads", 1,
                   "--runtime-log", tmp_path / "runtime.log", site=site)
    assert proc.returncode == 0, proc.stderr
    summaries = summary_lines(proc.stdout)
    # one after the first image (the load took longer than --summary-s), one at the end
    assert len(summaries) >= 2 and summaries[0].group(1) == "1", proc.stdout
    assert all(float(m.group(4)) < 1000 for m in summaries), proc.stdout


def test_the_live_accuracy_counts_every_head_count_that_ran_and_none_without_labels() -> None:
    stats = board_app_module().Stats()
    assert stats.live_top1() is None
    stats.add(3, 1.0, None)  # an unlabelled image counts for nothing
    assert stats.live_top1() is None
    stats.add(3, 1.0, True)
    stats.add(12, 1.0, False)
    stats.add(12, 1.0, False)
    assert stats.live_top1() == pytest.approx(100 / 3) and stats.summary(3)["live_top1"] == 100.0


def test_each_summary_shows_the_live_accuracy_so_far(board: dict[str, Path], tmp_path: Path) -> None:
    """Labelled images (a sub-folder per class): every summary line, not only the totals at the end, gives live
    top-1 over what was served so far, so a run stopped with Ctrl-C has it; unlabelled images give none."""
    proc = run_app(board, "--images", board["images"], "--max-images", 6, "--summary-s", 0.001, "--threads", 1,
                   "--runtime-log", tmp_path / "runtime.log")  # a summary after each image, the first included
    assert proc.returncode == 0, proc.stderr
    summaries = summary_lines(proc.stdout)
    assert len(summaries) >= 2 and all(m.group(5) is not None for m in summaries), proc.stdout
    assert float(summaries[0].group(5)) in (0.0, 100.0)  # of one image
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(board["images"] / "1" / "0.png", flat / "a.png")
    proc = run_app(board, "--images", flat, "--max-images", 2, "--runtime-log", tmp_path / "runtime.log")
    summaries = summary_lines(proc.stdout)
    assert proc.returncode == 0 and summaries and all(m.group(5) is None for m in summaries), proc.stdout


def test_max_images_below_one_is_refused_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(deploy, ["--bundle", str(tmp_path), "--lut", str(tmp_path), "--local",
                                         "--images", str(tmp_path), "--remote-dir", str(tmp_path / "dev"),
                                         "--max-images", "-3"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == (
        "Error: Invalid value for '--max-images': -3 is not a whole number from 1 to 1000000000")
    assert not (tmp_path / "dev").exists()
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(tmp_path), "--images", str(tmp_path),
                           "--max-images", "-3"], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "app.py: error: argument --max-images: -3 is not a whole number from 1 to 1000000000")


@pytest.mark.parametrize("flag, value", [("--loop-window-s", "0"), ("--loop-sustain-s", "-1"),
                                         ("--loop-dwell-s", "nan")])
def test_a_loop_timing_that_is_not_a_positive_number_is_one_line(flag: str, value: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(tmp_path), "--images", str(tmp_path), flag, value],
                          capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"app.py: error: argument {flag}: {value} is not a number above 0 and at most 86400")


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_stopping_deploy_stops_the_app_on_the_board(how: str, board: dict[str, Path], sshd_server: SshServer,
                                                     tmp_path: Path) -> None:
    remote = tmp_path / f"pi-{uuid.uuid4().hex[:8]}"
    host = start_host("deploy", "--bundle", board["bundle"], "--lut", board["lut"], "--host", sshd_server.spec,
                      "--identity", sshd_server.identity_file, "--known-hosts", sshd_server.known_hosts,
                      "--remote-dir", remote, "--images", board["images"], "--python", torch_free_python(tmp_path))
    switched = threading.Event()

    def watch() -> None:  # the app runs until stopped; its first switch line means it is classifying
        for line in iter(host.stdout.readline, ""):
            if line.startswith("switch None ->"):
                switched.set()
                return

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    assert switched.wait(120), "the app never started on the board"
    reader.join()
    output = stop_host_and_check_the_board(host, how, sshd_server, str(remote))
    if how == "ctrl-c":
        assert host.returncode == 130 and "Traceback" not in output and "sh -c" not in output, output
        assert output.strip().splitlines()[-2].startswith("Interrupted: the app deploy started was stopped")


def test_the_app_holds_the_latency_budget_on_the_scripted_day_and_says_why(board: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    """A budget no inference meets: on the cool, charging first step the loop takes 12 heads down to 3
    within its sustain window on the simulated clock (the step's images spread over its polls), and the
    switch line and the log say why; the table's own switches still happen as the day goes on."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"steps": scenario_steps(images_per_step=40)}))
    log = tmp_path / "events.json"
    proc = subprocess.run(
        [sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--images",
         str(board["images"]), "--scenario", str(scenario), "--sysfs-root", str(tmp_path / "sysfs"), "--threads", "1",
         "--budget-ms", "0.0001", "--plain", "--log", str(log)],
        capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(log.read_text())
    events = report["events"]
    assert events[0]["to"] == 12 and events[0]["reason"] == "start"
    first = next(e for e in events if e["reason"].startswith("latency p90"))
    assert (first["from"], first["to"]) == (12, 3) and "over budget 0.0001 ms for 1" in first["reason"]
    assert 10 <= first["time"] <= 30  # sustained for 10 s, within the first 30 s step
    assert any(f"12 -> 3 heads [{first['reason']}]" in line for line in proc.stdout.splitlines())
    # never above the table's choice: 3 heads when very hot, whatever the loop probes
    assert all(e["to"] == 3 for e in events if round(e["reading"]["thermal"]) == 84)
    assert report["latency"]["budget_ms"] == 0.0001 and report["latency"]["cap"] in (3, 6, 12)


def test_the_app_serves_a_live_page_of_what_it_runs_and_a_port_in_use_is_one_line(board: dict[str, Path]) -> None:
    """--serve: the page's state is the app's own (head count, the class name it predicted, the latency it
    timed), read while it classifies, its times seconds since the app started (not the machine's uptime);
    a second app asking for the same port stops in one line."""
    import urllib.request

    port = free_port()
    launched = time.monotonic()
    app = subprocess.Popen([sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]),
                            "--plain", "--images", str(board["images"]), "--serve", f"127.0.0.1:{port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})
    try:
        state: dict = {}
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/state.json", timeout=5) as reply:
                    state = json.loads(reply.read())["state"] or {}
            except OSError:
                pass
            if state.get("images", 0) >= 5 and state.get("history"):
                break
            time.sleep(0.1)
        classes = read_manifest(board["bundle"]).classes or [str(i) for i in range(10)]
        assert state["heads"] in (3, 6, 12) and state["predicted"] in classes, state
        assert state["p50_ms"] > 0 and all(p["latency_ms"] > 0 for p in state["history"])
        assert state["switches"][0]["from_heads"] is None and state["switches"][0]["to_heads"] in (3, 6, 12)
        assert 0 <= state["switches"][0]["t"] <= state["t"] <= time.monotonic() - launched, state
        assert all(0 <= p["t"] <= state["t"] for p in state["history"]), state["history"]
        second = run_app(board, "--images", board["images"], "--max-images", 2, "--serve", f"127.0.0.1:{port}")
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"cannot serve the live page on 127.0.0.1:{port}: the port is in use" in second.stderr
    finally:
        app.terminate()  # stops it as Ctrl-C does: its summary is written to the pipes read here
        app.communicate(timeout=30)


# Class names a bundle may carry that a terminal would obey if printed raw: a title-setting OSC, a colour,
# a newline that forges a log line, a bidi override, a C1 CSI, and rich markup (a hyperlink, blink).
HOSTILE = ["\x1b]0;owned\x07", "\x1b[31mred", "two\nswitch 3 -> 12 heads [forged]", "\u202eevil", "c1\x9b2J",
           "[link=javascript:alert(1)]click", "[blink]x", "sept", "huit", "neuf"]


def hostile_board(board: dict[str, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the bundle whose classes are ``HOSTILE``, its table and image folders named by them."""
    bundle = tmp_path / "bundle"
    shutil.copytree(board["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["classes"] = HOSTILE
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    for label in HOSTILE[:7]:
        shutil.copytree(board["images"] / "0", tmp_path / "images" / label)
    return bundle, table_for(bundle, tmp_path), tmp_path / "images"


def no_terminal_commands(text: str) -> None:
    """Nothing in ``text`` a terminal would act on: no ESC, BEL, C1 control or bidi override."""
    assert not re.search("[\x1b\x07\x80-\x9f\u202a-\u202e\u2066-\u2069]", text), ascii(text)


def test_hostile_class_names_reach_the_terminal_escaped_one_line_each(board: dict[str, Path], tmp_path: Path) -> None:
    """A class name never sets the terminal's title, colours it or forges a line: each is shown escaped
    (\\x1b, \\n, \\u202e) in its one line, the JSON log keeps it as it is."""
    bundle, lut, images = hostile_board(board, tmp_path)
    log = tmp_path / "log.json"
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(bundle), "--lut", str(lut), "--images",
                           str(images), "--plain", "--each-image", "--max-images", "28", "--threads", "1", "--log",
                           str(log)],
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    no_terminal_commands(proc.stdout + proc.stderr)
    lines = proc.stdout.splitlines()
    assert not any("[forged]" in line and not line.startswith("image ") for line in lines), proc.stdout
    said = [line for line in lines if line.startswith("image ")]
    assert len(said) == 28 and all(re.fullmatch(r"image \d+: .+ \(\d+ heads, [\d.]+ ms, labelled .+\)", s) for s in said)
    labelled = {re.search(r", labelled (.+)\)$", s).group(1) for s in said}
    assert labelled == {"\\x1b]0;owned\\x07", "\\x1b[31mred", "two\\nswitch 3 -> 12 heads [forged]", "\\u202eevil",
                        "c1\\x9b2J", "[link=javascript:alert(1)]click", "[blink]x"}
    assert json.loads(log.read_text())["per_heads"]  # the log is written as ever


OLDER_APP = """import sys
print("image 1: \\x1b]0;owned\\x07 (3 heads) \\x1b[31mred \\u202eevil \\x9b2J")
print("Error: \\x1b]0;gone\\x07", file=sys.stderr)
sys.exit(1)
"""


@pytest.mark.parametrize("app", ["this app", "an app printing raw"])
def test_deploy_shows_what_the_board_prints_escaped(board: dict[str, Path], tmp_path: Path, app: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy shows the board's lines, its one Error line included, with no ESC/OSC, C1 or bidi control left in
    them: the app's own output, and that of an app (an older copy on the board) that prints names raw."""
    bundle, lut, images = hostile_board(board, tmp_path)
    if app == "an app printing raw":
        (tmp_path / "older").mkdir()
        monkeypatch.setattr("hydra_edge.commands.deploy.APP", tmp_path / "older" / "app.py")
        (tmp_path / "older" / "app.py").write_text(OLDER_APP)
    result = CliRunner().invoke(deploy, ["--bundle", str(bundle), "--lut", str(lut), "--local", "--images",
                                         str(images), "--max-images", "28", "--python", sys.executable,
                                         "--remote-dir", str(tmp_path / "dev")])
    no_terminal_commands(result.output)
    if app == "this app":  # its last line names the class it last predicted, one of HOSTILE
        last = re.search(r"^\d+ s: 28 images \(.+\), \d+ heads, .+, last (.+)$", result.output, re.M)
        assert result.exit_code == 0 and last and last.group(1) in [shown(name) for name in HOSTILE], result.output
    else:
        assert result.exit_code == 1 and "image 1: \\x1b]0;owned\\x07 (3 heads) \\x1b[31mred \\u202eevil \\x9b2J" \
            in result.output and result.output.strip().endswith("exit 1: \\x1b]0;gone\\x07"), result.output


def test_demo_shows_the_apps_lines_escaped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The demo plays the app as deploy does: an app printing raw names shows them escaped, its Error line too."""
    from hydra_edge.commands.demo import play
    from hydra_edge.errors import HydraEdgeError

    (tmp_path / "app.py").write_text(OLDER_APP)
    with pytest.raises(HydraEdgeError) as e:
        play([sys.executable, str(tmp_path / "app.py")], lambda url: None)
    out = capsys.readouterr().out
    no_terminal_commands(out + str(e.value))
    assert out == "image 1: \\x1b]0;owned\\x07 (3 heads) \\x1b[31mred \\u202eevil \\x9b2J\n" and \
        str(e.value) == "\\x1b]0;gone\\x07"


def run_in_a_terminal(argv: list[str], timeout: float = 300) -> tuple[int, str]:
    """``argv`` with a 200-column pseudo-terminal as stdout and stderr (rich draws its live table there);
    its exit code and everything it wrote, as the terminal received it."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(argv, stdout=child_fd, stderr=child_fd, stdin=subprocess.DEVNULL,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TERM": "xterm-256color"})
    os.close(child_fd)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the process and every copy of the terminal are gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def test_the_live_table_shows_names_as_text_never_as_markup_or_terminal_commands(board: dict[str, Path],
                                                                                tmp_path: Path) -> None:
    """On a terminal (rich's live table): whatever class is predicted, its name is printed as written, its
    ``[link=...]`` never an OSC 8 hyperlink, ``[blink]`` never eaten, ESC and U+202E shown escaped."""
    bundle = tmp_path / "bundle"
    shutil.copytree(board["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = [*HOSTILE[:7], "[link=https://example.com]y", "[blink]z", "\x1b]8;;http://x\x07w"]
    manifest["classes"] = names
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    lut = table_for(bundle, tmp_path)
    code, screen = run_in_a_terminal([sys.executable, str(APP), "--bundle", str(bundle), "--lut", str(lut),
                                      "--images", str(board["images"] / "0"), "--max-images", "12", "--threads", "1"])
    assert code == 0, screen
    assert "\x1b]" not in screen and "\x07" not in screen and "\u202e" not in screen, ascii(screen)
    shown = ["\\x1b]0;owned\\x07", "\\x1b[31mred", "two\\nswitch 3 -> 12 heads [forged]", "\\u202eevil", "c1\\x9b2J",
             "[link=javascript:alert(1)]click", "[blink]x", "[link=https://example.com]y", "[blink]z",
             "\\x1b]8;;http://x\\x07w"]
    assert any(name in screen for name in shown), ascii(screen)  # the class predicted, whichever it is


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigterm_stops_the_app_as_ctrl_c_does_keeping_its_summary_and_log(board: dict[str, Path], tmp_path: Path,
                                                                         sig: signal.Signals) -> None:
    """systemd stops a service with SIGTERM: the app ends as on Ctrl-C, its summary printed and --log written."""
    log = tmp_path / "events.json"
    app = subprocess.Popen([sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]),
                            "--plain", "--each-image", "--images", str(board["images"]), "--threads", "1", "--log",
                            str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        for line in iter(app.stdout.readline, ""):
            if line.startswith("image 5:"):
                break
        app.send_signal(sig)
        out, err = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
    assert app.returncode == 0 and "Traceback" not in err, err
    assert "stopped" in out.splitlines() and re.search(r"^ *\d+ heads: \d+ images, median", out, re.M), out
    report = json.loads(log.read_text())
    assert report["events"] and sum(s["images"] for s in report["per_heads"].values()) >= 5


def test_plain_output_is_each_switch_and_a_summary_every_few_seconds_not_a_line_per_image(
        board: dict[str, Path]) -> None:
    """What deploy streams from a board serving hundreds of images a second: the switches, and a summary
    line every --summary-s (images so far, rate, head count, p50/p90, live top-1, switches) whose counts grow; no line
    per image. Stopped, it prints one last summary and the per-head-count totals."""
    app = subprocess.Popen([sys.executable, str(APP), "--bundle", str(board["bundle"]), "--lut", str(board["lut"]),
                            "--plain", "--images", str(board["images"]), "--threads", "1", "--summary-s", "0.5"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        lines = []
        for line in iter(app.stdout.readline, ""):
            lines.append(line.rstrip("\n"))
            if sum(bool(SUMMARY.fullmatch(x)) for x in lines) == 2:
                break
        app.send_signal(signal.SIGINT)
        out, err = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
    lines += out.splitlines()
    assert app.returncode == 0 and "Traceback" not in err, err
    summaries = summary_lines("\n".join(lines))
    counts = [int(m.group(1)) for m in summaries]
    assert len(counts) == 3 and counts == sorted(counts) and counts[0] > 0, lines  # two while serving, one at the end
    assert all(m.group(5) is not None for m in summaries), lines  # the images are labelled: live top-1 in each
    assert lines[0].startswith("switch None ->") and not any(x.startswith("image ") for x in lines), lines
    assert re.search(r"^ *\d+ heads: \d+ images, median", out, re.M), out


def test_the_app_serves_beyond_loopback_only_with_serve_remote(board: dict[str, Path]) -> None:
    """--serve on an address that is not loopback without --serve-remote: exit 1, one line naming the flag, before
    anything is served or classified."""
    port = free_port()
    proc = run_app(board, "--images", board["images"], "--max-images", 2, "--serve", f"0.0.0.0:{port}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert "0.0.0.0 is not a loopback address" in line and "--serve-remote" in line, line
    assert "live page:" not in proc.stdout and "image 1:" not in proc.stdout, proc.stdout


def board_app_module() -> object:
    """The board app's module, imported from its file as the device runs it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("board_app", APP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


class PoweredSwitcher:
    """What ``PageFeed`` reads of a switcher, on a board whose last reading had ``battery_pct`` and ``charging``."""

    def __init__(self, battery_pct: float, charging: bool) -> None:
        from hydra_edge.runtime.switcher import Reading

        self.heads, self.events, self.reading = 3, [], Reading(battery_pct, charging, 45.0)
        self.notes = ("battery unknown since 12 s",) if battery_pct != battery_pct else ()

    def latency_status(self) -> None:
        return None


@pytest.mark.parametrize("battery_pct, charging, expected", [
    (-1.0, False, (True, None, None)),  # the profile names no battery: mains
    (float("nan"), False, (False, None, None)),  # a battery that could not be read: unknown, not mains nor "on battery"
    (64.0, False, (False, 64.0, False)),
    (64.0, True, (False, 64.0, True)),
], ids=["no battery", "unreadable", "discharging", "charging"])
def test_the_page_says_mains_only_for_a_board_without_a_battery(battery_pct: float, charging: bool,
                                                               expected: tuple) -> None:
    """A Pi whose profile names no battery runs on mains: the page's state says so (``mains``), with no charge
    and no charging flag that the page would show as "on battery"."""
    feed = board_app_module().PageFeed(PoweredSwitcher(battery_pct, charging), {}, lambda: 1.0)
    state = feed.snapshot()
    assert (state.mains, state.battery_pct, state.charging) == expected
    unknown = battery_pct != battery_pct
    assert state.battery_assumed is unknown and state.notes == (["battery unknown since 12 s"] if unknown else [])


def test_a_long_service_keeps_its_stats_and_switch_log_bounded(board: dict[str, Path], tmp_path: Path) -> None:
    """A week of images and a flapping day cost bounded memory: the app's per-head-count stats keep counts of
    every image but only the latest ``WINDOW`` latencies, and the switcher keeps the latest ``max_events``
    switches while counting them all; a display is handed each new switch once."""
    from hydra_edge.runtime.switcher import MAX_EVENTS, Switcher

    assert MAX_EVENTS <= 10_000  # the board's default: a few hundred kB of events at most
    kept = 40  # the same rule at a size a test reaches in a few hundred polls

    app = board_app_module()
    stats = app.Stats()
    for i in range(20 * stats.WINDOW):
        stats.add((3, 6, 12)[i % 3], float(i % 7), None if i % 5 == 0 else i % 2 == 0)
    for heads in (3, 6, 12):
        assert len(stats.heads[heads].latency_ms) == stats.WINDOW
        assert stats.summary(heads)["images"] == sum(1 for i in range(20 * stats.WINDOW) if (3, 6, 12)[i % 3] == heads)
    labelled = [i for i in range(20 * stats.WINDOW) if i % 5 and (3, 6, 12)[i % 3] == 3]
    assert stats.summary(3)["live_top1"] == pytest.approx(100 * sum(i % 2 == 0 for i in labelled) / len(labelled))

    sim = app.SimulatedBoard(tmp_path / "sysfs", [])
    with Switcher(board["bundle"], lut=board["lut"], root=str(tmp_path / "sysfs"), clock=sim.clock,
                  prefetch=False, max_events=kept) as sw:
        seen, shown = 0, []
        while sw.switches < 3 * kept:  # very hot, then cool for raise_after_s: two switches a cycle
            for temp_c in (85.0, 40.0, 40.0, 40.0):
                sim.apply({"temp_c": temp_c, "battery_pct": 100, "status": "Charging"})
                sim.now += 5.0
                sw.poll()
            new, seen = sw.events_since(seen)
            shown += new
        assert len(sw.events) == kept and len(sw.event_log()) == kept
        assert len(shown) == sw.switches and shown[-kept:] == sw.events  # each switch shown once, in order
        assert {e.to_heads for e in sw.events} == {3, 12}
