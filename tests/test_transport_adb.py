"""adb specifics through the real adb client and a stand-in phone."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.adbd import AdbDevice, AdbServer, start_adbd
from support.processes import free_port

from hydra_edge.transport import (
    AdbTransport,
    DeviceNotFoundError,
    DeviceUnauthorizedError,
    ToolMissingError,
    TransportError,
    open_transport,
)


def test_android_serial_is_honoured(adb_device: AdbDevice, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANDROID_SERIAL", adb_device.serial)
    with open_transport(adb_port=adb_device.server.port) as t:
        assert t.device_id == f"adb:{adb_device.serial}"
        assert t.run(["getprop", "ro.product.model"]).stdout.strip() == "Hydra Test Phone"
        assert t.base_dir == "/data/local/tmp/hydra-edge"
        (tmp_path / "runner.py").write_text("print('hi')\n")
        t.push(tmp_path / "runner.py", t.remote_path("bundle", "runner.py"))
    # the phone's /data/local/tmp is the stand-in's sandbox
    assert adb_device.host_path("/data/local/tmp/hydra-edge/bundle/runner.py").read_text() == "print('hi')\n"


def test_the_only_attached_device_is_used_when_none_is_named(adb_device: AdbDevice,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    t = AdbTransport(adb_port=adb_device.server.port)
    assert t.serial == adb_device.serial


def test_a_missing_device_says_how_to_connect_it(adb_server: AdbServer) -> None:
    with pytest.raises(DeviceNotFoundError) as info:
        open_transport(serial="127.0.0.1:9", adb_port=adb_server.port)
    message = str(info.value)
    assert "\n" not in message
    assert "127.0.0.1:9 is not connected" in message and f"adb -P {adb_server.port} connect" in message


def test_an_unauthorised_device_says_to_accept_the_prompt(adb_server: AdbServer, tmp_path: Path) -> None:
    phone = start_adbd(tmp_path / "locked", adb_server, serial="LOCKED01", unauthorized=True)
    try:
        with pytest.raises(DeviceUnauthorizedError, match="has not authorised this computer"):
            open_transport(serial=phone.serial, adb_port=adb_server.port)
    finally:
        phone.stop()


def test_missing_adb_client_is_named(adb_server: AdbServer) -> None:
    with pytest.raises(ToolMissingError, match="apt-get install adb"):
        AdbTransport("X", adb_port=adb_server.port, adb="adb-not-installed").connect()


def test_a_forward_is_made_by_the_adb_server_and_removed_after(adb_device: AdbDevice) -> None:
    """``adb forward`` while the block runs, gone after it; a local port in use is one line and no forward."""
    server = adb_device.server
    with open_transport(serial=adb_device.serial, adb_port=server.port) as t:
        local = free_port()
        with t.forward(8765, local) as port:
            assert port == local
            assert f"{adb_device.serial} tcp:{local} tcp:8765" in server.adb("forward", "--list").stdout
            # the adb server listens on the local end for the phone's loopback
            socket.create_connection(("127.0.0.1", local), timeout=5).close()
        assert f"tcp:{local}" not in server.adb("forward", "--list").stdout
        with socket.create_server(("127.0.0.1", 0)) as taken:
            busy = taken.getsockname()[1]
            with pytest.raises(TransportError, match=f"^port {busy} on this machine is in use"):
                with t.forward(8765, busy):
                    pytest.fail("forwarded a port another program holds")
        assert f"tcp:{busy}" not in server.adb("forward", "--list").stdout


def test_a_forward_someone_else_made_is_not_taken_over(adb_device: AdbDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """adb's own listener on the port (another user's forward) is this machine's port in use, left as it was."""
    server = adb_device.server
    local = free_port()
    assert server.adb("-s", adb_device.serial, "forward", f"tcp:{local}", "tcp:9000").returncode == 0
    try:
        monkeypatch.setattr("hydra_edge.transport.base.ensure_free", lambda port: None)  # as if taken after the check
        with open_transport(serial=adb_device.serial, adb_port=server.port) as t:
            with pytest.raises(TransportError, match=f"^port {local} on this machine is in use"):
                with t.forward(8765, local):
                    pytest.fail("took over another forward")
        assert f"tcp:{local} tcp:9000" in server.adb("forward", "--list").stdout
    finally:
        server.adb("forward", "--remove", f"tcp:{local}")
