"""`hydra-edge demo` end to end (small settings): every stage's files exist, the bundle is compact
(every head count but the largest rebuilt on the device from a skeleton and a recipe), the app switched,
and the terminal showed no library chatter. Run as a user runs it, in a process of its own, so that
what native code writes to the terminal's descriptors is seen too. Its second run (it resumes) serves
the live page while the day plays and holds it; the bundle it made is deployed with --serve over ssh."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner
from support.boards import on_board, start_host
from support.processes import free_port, gone, running
from support.pythons import torch_free_python
from support.sshd import SshServer

from hydra_edge.commands.demo import demo as demo_command
from hydra_edge.commands.deploy import deploy
from hydra_edge.measure.journal import read_calibration
from hydra_edge.records.manifest import read_manifest
from hydra_edge.records.recipe import read_recipe

ARGS = ["demo", "--epochs", "2", "--heads", "3,12", "--runs", "3", "--images", "2", "--jobs", "1"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """The demo run once, as a user first runs it (no page): its folder, exit code and output."""
    out = tmp_path_factory.mktemp("demo")
    return (out, *demo([*ARGS, "--out", str(out)]))


@pytest.mark.slow  # runs the whole demo
def test_demo_runs_the_whole_pipeline_on_a_compact_bundle(first_run: tuple[Path, int, str]) -> None:
    tmp_path, code, output = first_run
    assert code == 0, output
    assert (tmp_path / "run" / "accuracy.png").is_file()
    bundle = tmp_path / "bundle"
    small, large = read_manifest(bundle).artefacts
    assert (small.heads, large.heads) == (3, 12) and small.format == large.format == "tflite"
    # one weight set: the 12-head file whole; 3 heads as skeleton + recipe, its own file never written
    assert large.compact is None and (bundle / large.file).is_file() and not (bundle / small.file).exists()
    recipe = read_recipe(bundle / small.compact.recipe)
    assert (bundle / recipe.skeleton.file).is_file() and recipe.source.file == large.file
    calibration = read_calibration(next((tmp_path / "calibration").glob("*.json")))
    assert [(r.heads, r.golden["passed"]) for r in calibration.measured()] == [(3, True), (12, True)]
    assert calibration.result(3).rebuild_s > 0 and not isinstance(calibration.result(12).rebuild_s, float)
    table = json.loads((tmp_path / "lut" / "lut.json").read_text())
    assert table["calibration"]["device_id"] == calibration.device_id
    assert {p.name for p in (tmp_path / "lut").iterdir()} >= {"lut.json", "hydra_lut.h", "HydraLut.kt", "lut.png"}
    report = json.loads((tmp_path / "app" / "events.json").read_text())
    events = report["events"]
    assert events[0]["reason"] == "start" and events[0]["reading"]["battery_pct"] == 100
    # the app ran every head count it switched to from the compact bundle, none fell back for a failed load
    assert not any(e["reason"].startswith("load failed") for e in events) and report["fallback"] is None
    assert set(report["per_heads"]) <= {str(e["to"]) for e in events} and report["per_heads"]
    assert "Where everything is:" in output and str(tmp_path / "lut") in output
    # LiteRT's banner ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.") is in the app's
    # runtime log, named on the terminal, and nowhere on the terminal itself
    assert "XNNPACK" not in output, output
    # nor what the conversion workers' imports print (absl's and TensorFlow's oneDNN banners)
    assert "absl::InitializeLog" not in output and "oneDNN" not in output, output
    assert "XNNPACK" in (tmp_path / "app" / "runtime.log").read_text()
    assert f"runtime output: {tmp_path / 'app' / 'runtime.log'}" in output
    assert "live page" not in output  # no page unless asked for


@pytest.mark.slow  # runs the demo's last stages again, paced
def test_a_second_run_resumes_serves_the_page_while_the_day_plays_and_holds_it(
        first_run: tuple[Path, int, str]) -> None:
    """Nothing is trained, converted or timed again (-v shows the runtime's banner too); with --serve the URL
    is printed as the page serves, the page answers with the app's state while the day plays, --hold serves
    its last state after the day, and Ctrl-C then ends the demo cleanly."""
    out, code, _ = first_run
    assert code == 0
    before = {p: p.read_bytes() for p in [out / "run" / "checkpoint.pt", *(out / "calibration").glob("*.json")]}
    # what an earlier replay's latency loop left beside the table: each replay starts from the table instead
    (out / "lut" / "lut.correction.json").write_text("{}")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hydra_edge.cli", "-v", *ARGS, "--out", str(out),
                             "--serve", f"127.0.0.1:{port}", "--hold", "--pace", "0.3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    output = Output(proc)
    try:
        assert output.wait_for("live page: ", 600)[1] == f"live page: http://127.0.0.1:{port}/\n"
        # while the day plays: the app's own state, as it classifies (read before the demo's summary came)
        state = poll_state(port, lambda s: s["images"] > 0 and s["switches"])
        read_at = time.monotonic()
        assert state["heads"] in (3, 12) and state["switches"][0]["reason"] == "start", state
        assert output.wait_for("Done in", 300)[0] > read_at, "the day was over before the page was read"
        assert output.wait_for("holds the day's end", 60)[1] == (
            f"live page: http://127.0.0.1:{port}/ holds the day's end; Ctrl-C stops it\n")
        last = poll_state(port, lambda s: True)
        assert last["images"] > state["images"] and last["switches"][0] == state["switches"][0]
        assert last["battery_pct"] == 20 and last["charging"]  # the day's last step: back on the charger
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = output.text()
    assert proc.returncode == 0 and "Traceback" not in output and "stopped serving the live page" in output, output
    assert "lut.correction.json" not in output, output  # not read (it would be one warning): removed first
    assert "0 converted, 2 unchanged" in output, output
    assert "INFO: Created TensorFlow Lite XNNPACK delegate" in output, output
    assert all(p.read_bytes() == data for p, data in before.items())
    socket.create_server(("127.0.0.1", port)).close()  # the port is free again


@pytest.mark.slow  # runs the demo's last stage again
def test_sigterm_to_a_serving_demo_stops_the_app_it_started_and_frees_its_port(
        first_run: tuple[Path, int, str]) -> None:
    """SIGTERM (a supervisor's stop, ``kill``) to ``demo --serve --hold`` while the day plays stops the board app
    it started, as Ctrl-C does: the app shows its summary, the demo ends, and nothing keeps serving the port."""
    out, code, _ = first_run
    assert code == 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hydra_edge.cli", *ARGS, "--out", str(out),
                             "--serve", f"127.0.0.1:{port}", "--hold"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    output = Output(proc)
    app = str(out / "app" / "scenario.json")  # on the board app's command line only
    try:
        output.wait_for("live page: ", 400)
        poll_state(port, lambda s: s["images"] > 0)  # the day is playing
        assert running(app), "the board app is not running"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = output.text()
    assert proc.returncode == 130, (proc.returncode, text)  # as Ctrl-C ends it
    assert gone(app, within_s=10), running(app)
    assert "stopped" in text.splitlines() and re.search(r"^ *\d+ heads: \d+ images", text, re.M), text
    assert text.strip().splitlines()[-2:] == [
        f"Interrupted: every finished stage is kept in {out}, and the stage it stopped in goes on from its last "
        "epoch, artefact or head count.",
        f"Resume with: hydra-edge {' '.join(ARGS)} --out {out} --serve 127.0.0.1:{port} --hold"], text
    assert "Traceback" not in text and "holds the day's end" not in text, text
    socket.create_server(("127.0.0.1", port)).close()  # the port is free again


@pytest.mark.slow  # deploys the demo's bundle over sshd and runs the board app
def test_deploy_serves_the_page_through_an_ssh_forward(first_run: tuple[Path, int, str], sshd_server: SshServer,
                                                       tmp_path: Path) -> None:
    """The board app serves on the board's loopback; deploy forwards another local port to it, prints that URL
    as the page serves, and Ctrl-C stops the app on the board and the forward here; the board's port in use there
    is the app's one line, and no forward is left."""
    out, code, _ = first_run
    assert code == 0
    images = tmp_path / "images"
    for source in sorted((out / "app" / "images").rglob("*.png"))[:6]:
        (images / source.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(source, images / source.parent.name / source.name)
    remote, board_port, local_port = tmp_path / "pi", free_port(), free_port()
    args = ["--bundle", out / "bundle", "--lut", out / "lut", "--host", sshd_server.spec,
            "--identity", sshd_server.identity_file, "--known-hosts", sshd_server.known_hosts, "--remote-dir", remote,
            "--images", images, "--python", torch_free_python(tmp_path),
            "--serve", board_port, "--local-port", local_port]
    host = start_host("deploy", *args)
    output = Output(host)
    try:
        line = output.wait_for("live page: ", 300)[1]
        assert line == (f"live page: http://127.0.0.1:{local_port}/ (open it in a browser here; "
                        f"ssh:{sshd_server.spec}'s port {board_port}, forwarded while the app runs)\n")
        state = poll_state(local_port, lambda s: s["images"] > 0)  # through the forward, from the board
        assert state["heads"] in (3, 12) and state["predicted"] is not None
        assert on_board(sshd_server, str(remote))
        host.send_signal(signal.SIGINT)  # Ctrl-C
        host.wait(timeout=30)
    finally:
        if host.poll() is None:
            host.kill()
    output = output.text()
    assert host.returncode == 130 and "Traceback" not in output and "sh -c" not in output, output
    assert output.strip().splitlines()[-2].startswith("Interrupted: the app deploy started was stopped")
    assert gone(str(remote), within_s=10) and not on_board(sshd_server, str(remote))  # the app on the board
    assert gone(f"127.0.0.1:{local_port}:127.0.0.1:{board_port}", within_s=5)
    socket.create_server(("127.0.0.1", local_port)).close()  # the forward's port is free again

    # the board's port in use on the board: the app's one line is deploy's, and the forward is gone
    with socket.create_server(("127.0.0.1", board_port)):
        result = CliRunner().invoke(deploy, [str(a) for a in args])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == (
        f"Error: the app on ssh:{sshd_server.spec} stopped with exit 1: cannot serve the live page on "
        f"127.0.0.1:{board_port}: the port is in use (another app, or an earlier run still serving); give another "
        f"port, e.g. --serve 127.0.0.1:{board_port + 1}, or stop what holds it"), result.output
    assert not running(f"127.0.0.1:{local_port}:127.0.0.1:{board_port}")


def test_a_page_address_in_use_or_not_local_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(demo_command, ["--out", str(tmp_path / "out"), "--serve", f"127.0.0.1:{port}"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: cannot serve the live page on 127.0.0.1:{port}: the port is in use (another app, or an earlier "
        f"run still serving); give another port, e.g. --serve 127.0.0.1:{port + 1}, or stop what holds it"]
    result = CliRunner().invoke(demo_command, ["--out", str(tmp_path / "out"), "--serve", "192.0.2.7:8765"])
    assert result.exit_code == 1 and re.fullmatch(r"Error: 192\.0\.2\.7 is not a loopback address.*--serve-remote.*\n",
                                                  result.output), result.output
    for alone in (["--hold"], ["--pace", "1"], ["--serve-remote"]):
        result = CliRunner().invoke(demo_command, ["--out", str(tmp_path / "out"), *alone])
        assert result.exit_code == 2 and f"Error: {alone[0]} is about the live page; give --serve too" in result.output
    assert not (tmp_path / "out").exists()  # nothing was trained or written


class Output:
    """A process's output lines as they arrive, each with the time it came (read on a thread of its own)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in iter(proc.stdout.readline, ""):
            self.lines.append((time.monotonic(), line))

    def wait_for(self, text: str, timeout: float) -> tuple[float, str]:
        """The first line holding ``text`` and when it came; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next(((t, line) for t, line in list(self.lines) if text in line), None)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} within {timeout:g} s:\n{self.text()}")

    def text(self) -> str:
        """Everything, once the process has ended (and its output with it)."""
        self._reader.join(timeout=30)
        return "".join(line for _, line in self.lines)


def poll_state(port: int, ready: Callable[[dict], bool], timeout: float = 60) -> dict:
    """The page's state (``/state.json`` on this machine's ``port``) once ``ready(state)``."""
    deadline, state = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/state.json", timeout=5) as reply:
                state = json.loads(reply.read())["state"]
        except OSError:
            state = None
        if state and ready(state):
            return state
        time.sleep(0.1)
    raise AssertionError(f"the page on port {port} never showed a ready state: {state}")


def demo(args: list[str]) -> tuple[int, str]:
    """``hydra-edge ARGS`` in a process of its own: its exit code, and its stdout and stderr together."""
    done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1200, env={**os.environ, "COLUMNS": "200"})
    return done.returncode, done.stdout
