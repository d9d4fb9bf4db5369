"""adb specifics through the real adb client and a stand-in phone."""

from __future__ import annotations

from pathlib import Path

import pytest
from standins.adbd import AdbDevice, AdbServer, adb_device, adb_server, start_adbd  # noqa: F401  (fixtures)

from hydra_edge.transport import (
    AdbTransport,
    DeviceNotFoundError,
    DeviceUnauthorizedError,
    ToolMissingError,
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
