"""The Transport contract, checked against all three: this machine, a real sshd, a stand-in phone.

The calibrator sees only this interface, so every behaviour here must hold for every transport.
"""

from __future__ import annotations

import _thread
import hashlib
import json
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from support.adbd import AdbDevice
from support.processes import gone, running
from support.sshd import SshServer

from hydra_edge.errors import HydraEdgeError
from hydra_edge.transport import (
    IntegrityError,
    RemoteCommandError,
    RemoteFileNotFoundError,
    Transport,
    TransportInterrupted,
    TransportTimeout,
    open_transport,
)

pytestmark = pytest.mark.slow  # drives sshd and the adb stand-in

NASTY_DIR = "a b;'c\"$(x)`y`"
NASTY_ARGS = ["two words", "it's", 'say "hi"', "$HOME", "`id`", "$(id)", "a;b", "*", "\\n", "-n", ""]


KINDS = ["local", "ssh", "adb"]


def _open(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Transport:
    if kind == "local":
        return open_transport(local=True, workdir=tmp_path_factory.mktemp("local-device"))
    if kind == "ssh":
        server: SshServer = request.getfixturevalue("sshd_server")
        return open_transport(host=server.spec, remote_dir=str(tmp_path_factory.mktemp("ssh-home")), **server.options)
    device: AdbDevice = request.getfixturevalue("adb_device")
    return open_transport(serial=device.serial, adb_port=device.server.port)


@pytest.fixture(scope="module", params=KINDS)
def transport(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Transport]:
    """One transport per kind for the module; each test works in its own remote dir."""
    t = _open(request.param, request, tmp_path_factory)
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def rdir(transport: Transport) -> str:
    """A fresh, not yet created directory on the device."""
    return transport.remote_path(f"t-{uuid.uuid4().hex[:8]}")


def test_run_returns_stdout_stderr_and_exit_code(transport: Transport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert transport.run(["echo", "ok"]).ok


def test_nonzero_exit_raises_with_the_command_and_its_stderr(transport: Transport) -> None:
    with pytest.raises(RemoteCommandError, match=r"exited with 2 .*boom") as info:
        transport.run(["sh", "-c", "echo boom >&2; exit 2"])
    assert isinstance(info.value, HydraEdgeError) and info.value.result.returncode == 2


def test_arguments_reach_the_device_unchanged_and_never_execute(transport: Transport, rdir: str) -> None:
    transport.mkdir(rdir)
    pwned = f"{rdir}/pwned"
    args = [*NASTY_ARGS, f"; touch {pwned}", f"$(touch {pwned})", f"`touch {pwned}`", f"' ; touch {pwned}; '"]
    out = transport.run(["printf", "%s\\n", *args]).stdout
    assert out.split("\n")[:-1] == args
    assert not transport.exists(pwned)


def test_cwd_and_env_are_quoted_too(transport: Transport, rdir: str) -> None:
    where = f"{rdir}/{NASTY_DIR}"
    transport.mkdir(where)
    result = transport.run(["sh", "-c", 'pwd; printf "%s\\n" "$HYDRA_X"'], cwd=where, env={"HYDRA_X": "$(id); `id`"})
    assert result.stdout.splitlines()[0].endswith(NASTY_DIR)
    assert result.stdout.splitlines()[1] == "$(id); `id`"


def test_push_pull_round_trip_through_an_awkward_path(transport: Transport, rdir: str, tmp_path: Path) -> None:
    src = tmp_path / "model weights.bin"
    src.write_bytes(bytes(range(256)) * 5000 + b"tail")  # > one 64 KiB sync chunk, not a multiple
    remote = f"{rdir}/{NASTY_DIR}/model weights.bin"
    transport.push(src, remote)
    assert transport.exists(remote)
    assert transport.sha256(remote) == hashlib.sha256(src.read_bytes()).hexdigest()
    assert transport.run(["ls", "-a", f"{rdir}/{NASTY_DIR}"]).stdout.splitlines() == [".", "..", "model weights.bin"]
    back = transport.pull(remote, tmp_path / "back" / "copy.bin")
    assert back.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in back.parent.iterdir()) == ["copy.bin"]  # no temp file left


def test_empty_file_round_trip(transport: Transport, rdir: str, tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    transport.push(tmp_path / "empty", f"{rdir}/empty")
    assert transport.pull(f"{rdir}/empty", tmp_path / "empty.back").read_bytes() == b""


def test_corrupted_push_is_detected_and_removed(transport: Transport, rdir: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "artefact.onnx"
    src.write_bytes(b"x" * 1000)
    real_upload = transport._upload

    def upload_then_flip_a_byte(local: Path, remote: str) -> None:
        real_upload(local, remote)  # the file arrives, then the device's copy changes
        transport.run(["sh", "-c", 'printf y | dd of="$1" bs=1 seek=10 conv=notrunc 2>/dev/null', "sh", remote])

    monkeypatch.setattr(transport, "_upload", upload_then_flip_a_byte)
    with pytest.raises(IntegrityError, match="corrupted"):
        transport.push(src, f"{rdir}/artefact.onnx")
    assert transport.run(["ls", "-a", rdir]).stdout.splitlines() == [".", ".."]


def test_pull_of_a_missing_file_says_so(transport: Transport, rdir: str, tmp_path: Path) -> None:
    with pytest.raises(RemoteFileNotFoundError, match="does not exist"):
        transport.pull(f"{rdir}/nope.json", tmp_path / "nope.json")
    assert not (tmp_path / "nope.json").exists()


def test_exists_mkdir_free_bytes(transport: Transport, rdir: str) -> None:
    assert not transport.exists(rdir)
    transport.mkdir(f"{rdir}/x/y")
    transport.mkdir(f"{rdir}/x/y")
    assert transport.exists(f"{rdir}/x/y")
    assert transport.free_bytes(rdir) > 0


def test_stream_yields_lines_while_the_command_still_runs(transport: Transport, rdir: str) -> None:
    transport.mkdir(rdir)
    go = f"{rdir}/go"
    # The command prints a line, then waits (up to 60 s) for the test to answer it; a stream
    # that only delivered output at the end would make it report "no-answer".
    script = ('echo \'{"step": 1}\'; i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; '
              '[ -e "$1" ] && echo \'{"step": 2}\' || echo no-answer; echo warn >&2; exit 5')
    lines = []
    with transport.stream(["sh", "-c", script, "sh", go], check=False) as stream:
        for line in stream:
            lines.append(line)
            if len(lines) == 1:
                transport.run(["touch", go])
    assert [json.loads(line) for line in lines] == [{"step": 1}, {"step": 2}]
    assert stream.returncode == 5 and "warn" in stream.stderr


def test_stream_checks_the_exit_code(transport: Transport) -> None:
    with pytest.raises(RemoteCommandError, match="exited with 4"):
        with transport.stream(["sh", "-c", "echo a; exit 4"]) as stream:
            assert list(stream) == ["a"]


# Keeps writing, so even an ssh session without a tty ends once its reader goes away.
CHATTY_30S = 'touch "$1"; i=0; while [ $i -lt 300 ]; do echo .; sleep 0.1; i=$((i+1)); done'


def test_timeout_stops_the_command(transport: Transport, rdir: str) -> None:
    transport.mkdir(rdir)
    with pytest.raises(TransportTimeout, match="did not finish within 1 s"):
        transport.run(["sh", "-c", CHATTY_30S, "sh", f"{rdir}/started"], timeout=1)


def test_ctrl_c_becomes_a_transport_error(transport: Transport, rdir: str) -> None:
    transport.mkdir(rdir)
    started = f"{rdir}/started"

    def interrupt_once_started() -> None:
        for _ in range(600):
            if transport.exists(started):
                _thread.interrupt_main()
                return
            threading.Event().wait(0.1)

    watcher = threading.Thread(target=interrupt_once_started)
    watcher.start()
    try:
        with pytest.raises(TransportInterrupted, match="interrupted"):
            transport.run(["sh", "-c", CHATTY_30S, "sh", started])
    finally:
        watcher.join()


def test_one_transport_serves_many_threads(transport: Transport) -> None:
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = transport.run(["echo", f"n{i}"]).stdout.strip()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"n{i}" for i in range(6)}


def test_argv_must_be_a_list(transport: Transport) -> None:
    with pytest.raises(TypeError, match="list of strings"):
        transport.run("echo hi")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_closing_a_transport_stops_a_stream_another_thread_reads(
        kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What an interrupted fleet does: the main thread closes each device's transport, and every
    worker's command ends, on the device too (a command that watches its stdin, as the runner and
    the board app do, sees it close), however the device is reached."""
    t = _open(kind, request, tmp_path_factory)
    marker = f"hydra-close-{uuid.uuid4().hex}"
    started, outcome = threading.Event(), {}

    def worker() -> None:
        try:
            with t.stream(["sh", "-c", 'echo started; cat; echo "stdin closed"', "sh", marker]) as lines:
                for line in lines:
                    outcome.setdefault("lines", []).append(line)
                    started.set()
        except TransportInterrupted as e:
            outcome["error"] = e

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert started.wait(30) and running(marker)
        t.close()
        thread.join(15)
        assert not thread.is_alive() and isinstance(outcome.get("error"), TransportInterrupted)
        assert gone(marker, within_s=10), running(marker)
        with pytest.raises(TransportInterrupted, match="was closed"):
            t.run(["true"])
    finally:
        t.close()
        thread.join()
