"""hydra-edge calibrate over ssh against a real OpenSSH sshd on loopback: odd remote paths, a
fleet, clear failures, and a board whose sshd dies mid-calibration."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from support.boards import on_board, start_host, stop_host_and_check_the_board
from support.bundles import make_bundle
from support.cli import invoke, one_line_error
from support.processes import cmdline, descendants, free_port, stop_process, wait_for_port
from support.sshd import SshServer, start_sshd
from support.targets import HOST_TARGET

from hydra_edge.bounds import MAX_RUNS
from hydra_edge.measure.device import push_files
from hydra_edge.measure.journal import read_calibration
from hydra_edge.measure.session import runner_files
from hydra_edge.transport import RemoteCommandError, open_transport

pytestmark = pytest.mark.slow  # drives a real sshd and converts a bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compact, as convert writes by default: 12 heads whole, 3 and 6 rebuilt on the board."""
    return make_bundle(tmp_path_factory.mktemp("onnx"), HOST_TARGET, "3,6,12", layout="compact")


def _ssh_args(server: SshServer) -> tuple[object, ...]:
    return ("--identity", server.identity_file, "--known-hosts", server.known_hosts)


def test_calibration_over_ssh_into_a_remote_dir_with_spaces_quotes_and_semicolons(
        bundle: Path, device_python: Path, sshd_server: SshServer, tmp_path: Path) -> None:
    remote = tmp_path / "board dir; touch pwned 'q\" $(touch pwned)"
    result = invoke("--bundle", bundle, "--host", sshd_server.spec, *_ssh_args(sshd_server), "--remote-dir", remote,
                    "--python", device_python, "--out", tmp_path / "cal", "--runs", 10)
    assert result.exit_code == 0, result.output
    path = tmp_path / "cal" / f"ssh_{sshd_server.user}@127.0.0.1_{sshd_server.port}.json"
    cal = read_calibration(path)
    assert cal.device_id == f"ssh:{sshd_server.spec}" and [r.heads for r in cal.measured()] == [3, 6, 12]
    # the board rebuilt 3 and 6 heads from the pushed skeletons and recipes: that time is recorded
    assert [isinstance(r.rebuild_s, float) and 0 < r.rebuild_s < r.load_s for r in cal.results] == [True, True, False]
    pushed = {p.name for p in (remote / "bundles").glob("*/*")}
    assert {"vit_h3_onnx_fp32.skeleton", "vit_h12_onnx_fp32.onnx"} <= pushed and "vit_h3_onnx_fp32.onnx" not in pushed
    assert (remote / "runner" / "calibration" / "runner.py").is_file()
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_a_fleet_is_calibrated_concurrently_one_file_each(bundle: Path, device_python: Path,
                                                          sshd_server: SshServer, tmp_path: Path) -> None:
    """Two names for one board (address and ssh-config alias) stand in for two boards."""
    result = invoke("--bundle", bundle, "--host", sshd_server.spec, "--host", sshd_server.alias,
                    "--ssh-config", sshd_server.ssh_config, *_ssh_args(sshd_server),
                    "--remote-dir", tmp_path / "board", "--python", device_python, "--out", tmp_path / "cal",
                    "--runs", 5)
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "cal").glob("*.json"))
    assert files == sorted([f"ssh_{sshd_server.alias}.json",
                            f"ssh_{sshd_server.user}@127.0.0.1_{sshd_server.port}.json"])
    for name in files:
        assert [r.heads for r in read_calibration(tmp_path / "cal" / name).measured()] == [3, 6, 12]


@pytest.mark.parametrize("case", ["unknown host key", "refused", "odd user"])
def test_ssh_failures_are_one_line(case: str, bundle: Path, sshd_server: SshServer, tmp_path: Path) -> None:
    host, options = sshd_server.spec, _ssh_args(sshd_server)
    if case == "unknown host key":
        (tmp_path / "known_hosts").write_text("")
        options, expected = ("--identity", sshd_server.identity_file, "--known-hosts", tmp_path / "known_hosts"), \
            "is not in known_hosts"
    elif case == "refused":
        host, expected = f"root@127.0.0.1:{free_port()}", "refused the connection"
    else:
        host, expected = f"o'dd; touch {tmp_path / 'pwned'}@127.0.0.1:{sshd_server.port}", "refused to log in"
    line = one_line_error(invoke("--bundle", bundle, "--host", host, *options, "--out", tmp_path / "cal"))
    assert expected in line
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "cal").exists()


def _pull_the_plug(server: SshServer) -> None:
    """The board vanishes: sshd, its connections and everything they run die at once."""
    doomed = descendants(server.pid)
    server.stop()
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _restart(server: SshServer) -> subprocess.Popen:
    """Start sshd again with the same config, key and port: the board came back."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    with open(server.root / "sshd-2.log", "wb") as log:
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(server.root / "sshd_config")], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    wait_for_port(server.port, lambda: proc.poll() is None, "sshd")
    return proc


def test_sshd_killed_mid_calibration_then_a_rerun_finishes_every_head_count(
        bundle: Path, device_python: Path, tmp_path: Path) -> None:
    server = start_sshd(tmp_path / "sshd")
    out = tmp_path / "board.json"
    args = ("--bundle", bundle, "--host", server.spec, *_ssh_args(server), "--remote-dir", tmp_path / "board",
            "--python", device_python, "--out", out, "--runs", 4000, "--warmup", 0)

    def kill_after_first_block() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if out.exists() and any(r.blocks for r in read_calibration(out).results):
                _pull_the_plug(server)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_after_first_block)
    killer.start()
    restarted = None
    try:
        line = one_line_error(invoke(*args))
        killer.join()
        assert f"ssh:{server.spec}" in line
        assert f"of 3 head counts measured and every block timed so far are saved in {out}" in line
        assert "run the same command again to go on" in line
        first = read_calibration(out)
        assert len(first.measured()) < 3 and any(r.blocks for r in first.results)  # the kill landed mid-run
        restarted = _restart(server)
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    finally:
        killer.join()
        server.stop()
        if restarted is not None:
            stop_process(restarted)
    final = read_calibration(out)
    assert [r.heads for r in final.measured()] == [3, 6, 12]
    for r in first.results:  # what was timed before the drop was kept, not redone
        assert final.result(r.heads).blocks[:len(r.blocks)] == r.blocks


def test_ctrl_c_mid_calibration_keeps_what_was_measured(bundle: Path, device_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "here.json"
    args = ["--bundle", str(bundle), "--local", "--python", str(device_python), "--out", str(out),
            "--runs", "4000", "--warmup", "0"]
    code = f"from hydra_edge.commands.calibrate import calibrate; calibrate({args!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and any(r.blocks for r in read_calibration(out).results)) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    *_, said, resume = output.strip().splitlines()  # in a device stream or between them (a save, the progress bar)
    assert said == (f"Interrupted: each head count measured and each block of runs timed so far is saved in {out}; "
                    "the rest are measured, going on from those blocks, when it resumes."), output
    assert resume.startswith("Resume with: hydra-edge calibrate "), output
    assert "Traceback" not in output and "Aborted" not in output and "sh -c" not in output
    kept = read_calibration(out)
    assert len(kept.measured()) < 3 and any(r.blocks for r in kept.results)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    final = read_calibration(out)
    assert [r.heads for r in final.measured()] == [3, 6, 12]
    for r in kept.results:  # the rounds went on from what was kept
        assert final.result(r.heads).blocks[:len(r.blocks or [])] == (r.blocks or [])


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_stopping_the_host_stops_the_runner_on_the_board(how: str, bundle: Path, device_python: Path,
                                                          sshd_server: SshServer, tmp_path: Path) -> None:
    """Ctrl-C returns at once and a SIGKILLed host leaves nothing behind: the runner exits within
    seconds either way, instead of timing on unseen until its next line fails to reach us."""
    board = tmp_path / f"board-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "board.json"
    host = start_host("calibrate", "--bundle", bundle, "--host", sshd_server.spec, *_ssh_args(sshd_server),
                      "--remote-dir", board, "--python", device_python, "--out", out, "--runs", MAX_RUNS, "--warmup", 0)
    deadline = time.monotonic() + 120
    while not (out.exists() and on_board(sshd_server, "runner.py --bundle")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the device has reported itself: the runner is timing 3 heads, for minutes
    output = stop_host_and_check_the_board(host, how, sshd_server, str(board))
    if how == "ctrl-c":
        assert host.returncode == 130 and "Traceback" not in output, output
        assert output.strip().splitlines()[-2].startswith("Interrupted: "), output


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_stopping_the_host_stops_a_native_runner_that_ignores_its_stdin(how: str, sshd_server: SshServer) -> None:
    """A native benchmark binary (benchmark_model, executor_runner) cannot watch for its host as the
    Python runner does: the device's shell that reports its exit status stops it instead."""
    seconds = 900 + uuid.uuid4().int % 99  # `sleep N` with an N no other test uses: the board-side marker
    code = ("import sys\nfrom hydra_edge.measure.exits import reporting_exit\n"
            "from hydra_edge.transport import open_transport\n"
            f"with open_transport(host={sshd_server.spec!r}, **{ {k: str(v) for k, v in sshd_server.options.items()}!r}) as t:\n"
            f"    with t.stream(reporting_exit(['sleep', '{seconds}']), check=False) as lines:\n"
            "        for line in lines:\n            print(line, flush=True)\n")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not on_board(sshd_server, f"sleep {seconds}") and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_host_and_check_the_board(host, how, sshd_server, f"sleep {seconds}")


def test_a_remote_dir_with_a_leading_dash_a_backslash_and_a_newline_works(
        bundle: Path, device_python: Path, sshd_server: SshServer, tmp_path: Path) -> None:
    """sha256sum escapes such names in its output and commands would read '-dir' as an option; the
    push, the skip-what-is-there check and the run must all still work, leaving no staging files.
    Relative, so in the login user's home on the board, where ssh commands start."""
    remote_dir = f"-board back\\slash new\nline {uuid.uuid4().hex[:8]}"
    remote = Path(pwd.getpwnam(sshd_server.user).pw_dir) / remote_dir
    try:
        result = invoke("--bundle", bundle, "--host", sshd_server.spec, *_ssh_args(sshd_server),
                        "--remote-dir", remote_dir, "--python", device_python, "--out", tmp_path / "cal.json",
                        "--runs", 5, "--warmup", 0)
        assert result.exit_code == 0, result.output
        assert [r.heads for r in read_calibration(tmp_path / "cal.json").measured()] == [3, 6, 12]
        assert (remote / "runner" / "calibration" / "runner.py").is_file()
        assert not [p for p in remote.rglob("*") if p.name.startswith(".incoming-") or p.name.endswith(".hydra-part")]
        with open_transport(host=sshd_server.spec, remote_dir=remote_dir, **sshd_server.options) as t:
            assert push_files(t, runner_files("runner")) == 0  # every file recognised as already there
    finally:
        shutil.rmtree(remote, ignore_errors=True)


def test_a_push_that_fails_on_the_board_leaves_no_staging_files(sshd_server: SshServer) -> None:
    """The archive is unpacked on the board; when that fails (here a file stands where a folder
    must go) the archive and its half-unpacked folder are removed, even under a '-' remote dir."""
    remote_dir = f"-board-{uuid.uuid4().hex[:8]}"
    remote = Path(pwd.getpwnam(sshd_server.user).pw_dir) / remote_dir
    remote.mkdir()
    try:
        (remote / "runner").write_text("a file where the runner's folder must go")
        with open_transport(host=sshd_server.spec, remote_dir=remote_dir, **sshd_server.options) as t:
            with pytest.raises(RemoteCommandError, match="exited with"):
                push_files(t, runner_files("runner"))
        assert [p.name for p in remote.iterdir()] == ["runner"]
    finally:
        shutil.rmtree(remote, ignore_errors=True)


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_stopping_the_host_during_setup_stops_pip_on_the_board(how: str, bundle: Path, sshd_server: SshServer,
                                                              tmp_path: Path) -> None:
    """``--setup``'s pip install can take many minutes on a board; Ctrl-C (or a killed host) must end
    it there too, not leave it installing. The board's venv holds a pip that only sleeps when asked to
    install (no network here), standing in for one that is downloading and building quietly."""
    board = tmp_path / f"board-{uuid.uuid4().hex[:8]}"
    venv = board / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    started = board / "pip-started"
    (site / "pip" / "__main__.py").write_text(
        "import sys, time\nif sys.argv[1:] == ['--version']:\n    print('pip 0 (stand-in)')\n"
        f"else:\n    open({str(started)!r}, 'w').write(str(__import__('os').getpid()))\n    time.sleep(900)\n")
    host = start_host("calibrate", "--bundle", bundle, "--host", sshd_server.spec, *_ssh_args(sshd_server),
                      "--remote-dir", board, "--python", sys.executable, "--setup", "--out", tmp_path / "cal.json")
    deadline = time.monotonic() + 120
    while not (started.exists() and started.read_text()) and time.monotonic() < deadline and host.poll() is None:
        time.sleep(0.05)
    pip = int(started.read_text())
    try:
        output = stop_host_and_check_the_board(host, how, sshd_server, f"{venv}/bin/python -m pip install")
        # by its pid too: a process whose sshd session ended is no longer sshd's descendant, yet may run on
        deadline = time.monotonic() + 10
        while _running(pip) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pip), cmdline(pip)
    finally:
        if _running(pip):
            os.kill(pip, signal.SIGKILL)
    if how == "ctrl-c":
        assert host.returncode == 130 and "Traceback" not in output, output
        assert output.strip().splitlines()[-2].startswith("Interrupted: "), output


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent has ended)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
