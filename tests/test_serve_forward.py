"""Watching a page the device serves on its loopback: ``Transport.forward`` over ssh (a real sshd on
loopback plays the board), for this machine as the device, and the bad ports a user can give."""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner
from support.processes import free_port, gone, running
from support.sshd import SshServer

from hydra_edge.commands.deploy import deploy
from hydra_edge.transport import HostKeyError, LocalTransport, SshTransport, TransportError, open_transport


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"served on the board's loopback")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def board_page() -> Iterator[int]:
    """A page served on 127.0.0.1 (what the board app's --serve does on the board); yields its port."""
    server = HTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def forwarding(local: int, remote: int) -> list[str]:
    """The ``ssh -L`` processes of this forward still running on this machine."""
    return running(f"-L 127.0.0.1:{local}:127.0.0.1:{remote} ")


@pytest.mark.slow  # drives a real sshd
def test_an_ssh_forward_reaches_the_boards_loopback_and_is_gone_after(sshd_server: SshServer,
                                                                      board_page: int) -> None:
    local = free_port()
    with open_transport(host=sshd_server.spec, **sshd_server.options) as t:
        with t.forward(board_page, local) as port:
            assert port == local
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as reply:
                assert reply.read() == b"served on the board's loopback"
            [ssh] = forwarding(local, board_page)
            assert "StrictHostKeyChecking=yes" in ssh and "ControlPath=none" in ssh  # its own checked connection
        assert gone(f"-L 127.0.0.1:{local}:127.0.0.1:{board_page} ", within_s=5)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", local), timeout=2).close()
        # the transport's shared connection is untouched by the forward's end
        assert t.run(["echo", "still here"]).stdout == "still here\n"


@pytest.mark.slow  # drives a real sshd
def test_a_local_port_in_use_is_one_line_and_leaves_nothing_running(sshd_server: SshServer, board_page: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        local = taken.getsockname()[1]
        with open_transport(host=sshd_server.spec, **sshd_server.options) as t:
            with pytest.raises(TransportError) as info:
                with t.forward(board_page, local):
                    pytest.fail("forwarded to a port another program holds")
            assert str(info.value) == (f"port {local} on this machine is in use (another program, or an earlier "
                                       f"page still forwarded); give another local port, e.g. {local + 1}")
            # taken after the check (the check passes here): ssh fails to bind, and says so in the same line
            monkeypatch.setattr("hydra_edge.transport.base.ensure_free", lambda port: None)
            with pytest.raises(TransportError, match=f"^port {local} on this machine is in use"):
                with t.forward(board_page, local):
                    pytest.fail("a port another program holds passed for the forward")
        assert not forwarding(local, board_page)


@pytest.mark.slow  # drives a real sshd
def test_the_forward_checks_the_boards_host_key(sshd_server: SshServer, board_page: int, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    local = free_port()
    with SshTransport(sshd_server.spec, identity_file=sshd_server.identity_file, known_hosts=empty) as t:
        with pytest.raises(HostKeyError, match="not in known_hosts") as info:
            with t.forward(board_page, local):
                pytest.fail("forwarded to a board whose host key is unknown")
    assert "\n" not in str(info.value) and empty.read_text() == ""
    assert not forwarding(local, board_page)


@pytest.mark.parametrize("remote, local, what", [
    (0, None, "the device's port 0"), (65536, None, "the device's port 65536"), (8765, 0, "the local port 0"),
    (8765, 70000, "the local port 70000"), (True, None, "the device's port True"),
])
def test_a_port_out_of_range_is_one_line(remote: int, local: int | None, what: str, tmp_path: Path) -> None:
    with LocalTransport(tmp_path) as t:
        with pytest.raises(TransportError) as info:
            with t.forward(remote, local):
                pytest.fail("forwarded a port that is not one")
    assert str(info.value) == f"{what} is not a TCP port; give one from 1 to 65535"


def test_this_machine_as_the_device_forwards_nothing_but_checks_the_port(tmp_path: Path) -> None:
    with LocalTransport(tmp_path) as t:
        port = free_port()
        with t.forward(port) as local:
            assert local == port
        with pytest.raises(TransportError, match="this machine is the device: its port"):
            with t.forward(port, port + 1 if port < 65535 else port - 1):
                pytest.fail("a second port for this machine's own")
        with socket.create_server(("127.0.0.1", 0)) as taken:
            with pytest.raises(TransportError, match=f"port {taken.getsockname()[1]} on this machine is in use"):
                with t.forward(taken.getsockname()[1]):
                    pytest.fail("a port in use passed")


def test_deploy_serve_refuses_bad_ports_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    """Out of range, --local-port alone, with --detach, and this machine's port in use (checked before a file is
    sent or the app started): one line each, non-zero, nothing left listening."""
    (tmp_path / "bundle").mkdir()
    (tmp_path / "images").mkdir()
    base = ["--bundle", str(tmp_path / "bundle"), "--lut", str(tmp_path), "--local",
            "--images", str(tmp_path / "images"), "--remote-dir", str(tmp_path / "board")]

    def refused(*args: str) -> tuple[int, list[str]]:
        result = CliRunner().invoke(deploy, [*base, *args])
        return result.exit_code, result.output.strip().splitlines()[-1:]

    assert refused("--serve", "70000") == (2, ["Error: Invalid value for '--serve': 70000 is not a whole number "
                                                "from 1 to 65535"])
    assert refused("--local-port", "9000") == (2, ["Error: --local-port is the local end of --serve's forward; "
                                                    "give --serve PORT too"])
    assert refused("--serve", "8765", "--detach")[0] == 2
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert refused("--serve", str(port)) == (1, [f"Error: port {port} on this machine is in use (another program, "
                                                     f"or an earlier page still forwarded); give another local port, "
                                                     f"e.g. {port + 1}"])
    assert not (tmp_path / "board" / "app").exists()  # nothing was sent
