"""Local transport and the shared pieces: quoting, error mapping, the factory, space checks."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from hydra_edge.errors import HydraEdgeError
from hydra_edge.transport import LocalTransport, NoSpaceError, RemoteFileNotFoundError, open_transport
from hydra_edge.transport.base import TRANSFER_RULES, match_error, remote_command


def test_remote_command_quotes_every_word() -> None:
    line = remote_command(["printf", "%s\\n", "a b", "; rm -rf ~", "$(id)"], cwd="/tmp/x y", env={"K": "`id`"})
    assert line.startswith("cd '/tmp/x y' && env 'K=`id`' printf")
    out = subprocess.run(["sh", "-c", line.replace("cd '/tmp/x y' && ", "")], capture_output=True, text=True)
    assert out.stdout.splitlines() == ["a b", "; rm -rf ~", "$(id)"]
    assert shlex.split(line)[-3:] == ["a b", "; rm -rf ~", "$(id)"]


def test_remote_command_rejects_bad_env_names() -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        remote_command(["true"], env={"A;B": "1"})


@pytest.mark.parametrize("text, kind", [
    ("cat: write error: No space left on device", NoSpaceError),
    ("adb: error: failed to copy 'a' to 'b': remote No space left on device", NoSpaceError),
    ("adb: error: failed to stat remote object 'x': No such file or directory", RemoteFileNotFoundError),
])
def test_transfer_errors_are_recognised(text: str, kind: type) -> None:
    error = match_error(TRANSFER_RULES, text, lambda: {"device": "dev", "path": "/p"})
    assert isinstance(error, kind) and "\n" not in str(error)


def test_push_refuses_a_file_larger_than_the_free_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "big.bin").write_bytes(b"0" * 4096)
    with LocalTransport(tmp_path / "device") as t:
        monkeypatch.setattr(t, "free_bytes", lambda remote_dir: 100)
        with pytest.raises(NoSpaceError, match="needs 0.0 MiB"):
            t.push(tmp_path / "big.bin", "models/big.bin")
        assert not t.exists("models/big.bin")


def test_local_paths_resolve_in_the_workdir(tmp_path: Path) -> None:
    with open_transport(local=True, workdir=tmp_path / "device") as t:
        t.run(["sh", "-c", "echo hi > note.txt"])
        assert (tmp_path / "device" / "note.txt").read_text() == "hi\n"
        assert t.pull("note.txt", tmp_path / "note.txt").read_text() == "hi\n"
        assert t.run(["no-such-command-here"], check=False).returncode == 127


def test_a_temporary_workdir_is_removed_on_close() -> None:
    t = LocalTransport()
    workdir = t.workdir
    assert workdir.is_dir()
    t.close()
    assert not workdir.exists()


@pytest.mark.parametrize("kwargs", [{}, {"host": "pi@board", "local": True}, {"serial": "X", "host": "h"}])
def test_open_transport_needs_exactly_one_device(kwargs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    with pytest.raises(HydraEdgeError, match="name"):
        open_transport(**kwargs)


def test_stream_timeout_is_an_idle_limit(tmp_path: Path) -> None:
    """A command that keeps printing runs past the limit; one that falls silent is stopped."""
    from hydra_edge.transport import TransportTimeout

    with LocalTransport(tmp_path / "dev") as t:
        with t.stream(["sh", "-c", "for i in 1 2 3 4 5 6; do echo $i; sleep 0.3; done"], timeout=1.5) as lines:
            assert list(lines) == ["1", "2", "3", "4", "5", "6"]  # 1.8 s in all, never 1.5 s silent
        with pytest.raises(TransportTimeout, match="printed nothing for 0.5 s"):
            with t.stream(["sh", "-c", "echo started; sleep 30"], timeout=0.5) as lines:
                it = iter(lines)
                assert next(it) == "started"
                list(it)
