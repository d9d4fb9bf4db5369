"""An Android phone over adb, through the real ``adb`` client.

Commands go through ``adb shell`` with the shell protocol (exit codes and stderr kept apart,
Android 7+), files through ``adb push``/``adb pull`` (the sync protocol). ``-P PORT`` picks the
adb server, so a test or a second user can own theirs; ``ANDROID_SERIAL`` is honoured.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from .base import ErrorRule, Launch, Transport, device_dir, match_error, remote_command
from .errors import (
    ConnectionLostError,
    DeviceNotFoundError,
    DeviceUnauthorizedError,
    TransportError,
    UnreachableError,
)

DEFAULT_BASE_DIR = "/data/local/tmp/hydra-edge"  # the one place a shell user may write and exec
INSTALL_TIMEOUT_S = 600  # a 100 MiB APK over USB 2 and the phone's dexopt, with room to spare
INSTALL_HINT = "install the Android platform tools (apt-get install adb)"
# What the adb server says when a forward's local port is taken (by anyone, or by a forward --no-rebind keeps)
FORWARD_BIND_FAILED = re.compile(r"cannot bind|cannot rebind|already in use", re.IGNORECASE)

ADB_RULES = (
    ErrorRule(r"unauthorized", DeviceUnauthorizedError,
              "{device} has not authorised this computer; unlock it and accept the 'Allow USB debugging?' "
              "prompt, then try again"),
    ErrorRule(r"device '[^']*' not found|device not found|no devices/emulators found", DeviceNotFoundError,
              "adb device {serial} is not connected (see `adb{port_flag} devices`); plug it in, "
              "or for a network device run `adb{port_flag} connect HOST:PORT` first"),
    ErrorRule(r"offline|still connecting|still authorizing", DeviceNotFoundError,
              "{device} is offline; reconnect it (`adb{port_flag} reconnect`) and try again"),
    ErrorRule(r"more than one device", DeviceNotFoundError,
              "several adb devices are attached; pass a serial or set ANDROID_SERIAL"),
    ErrorRule(r"cannot connect to daemon|failed to start daemon|daemon not running", UnreachableError,
              "cannot reach an adb server on port {adb_port}; start one with `adb{port_flag} start-server`"),
    ErrorRule(r"protocol fault|error: closed|connection reset|broken pipe", ConnectionLostError,
              "the adb connection to {device} dropped"),
)


class InstallRefusedError(TransportError):
    """The phone's package manager refused an APK (``Failure [CODE: ...]``); ``code`` says which refusal."""

    def __init__(self, message: str, code: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.code, self.reason = code, reason or message


def _client_lines(stderr: str) -> str:
    """The lines the adb client itself wrote, not the device command's stderr."""
    marks = ("error:", "adb: error:", "adb: ", "* daemon", "cannot connect to daemon")
    return "\n".join(line for line in stderr.splitlines() if line.lower().startswith(marks))


class AdbTransport(Transport):
    """A phone reached through an adb server; remote paths are the phone's own."""

    def __init__(self, serial: str | None = None, *, adb_port: int | None = None,
                 remote_dir: str = DEFAULT_BASE_DIR, adb: str = "adb") -> None:
        super().__init__()
        self._adb_cmd = [adb, *(["-P", str(adb_port)] if adb_port else [])]
        self.adb_port = adb_port
        self.base_dir = device_dir(remote_dir)
        self.serial: str | None = None  # None only while looking for the one attached device
        self.serial = serial or os.environ.get("ANDROID_SERIAL") or self._only_device()

    @property
    def device_id(self) -> str:  # type: ignore[override]
        return f"adb:{self.serial}" if self.serial else "adb"

    def _adb(self, *args: str) -> Launch:
        serial = ["-s", self.serial] if self.serial else []
        return Launch([*self._adb_cmd, *serial, *args], install_hint=INSTALL_HINT)

    def _error_fields(self) -> dict[str, object]:
        return {"device": self.device_id, "serial": self.serial or "", "adb_port": self.adb_port or 5037,
                "port_flag": f" -P {self.adb_port}" if self.adb_port else ""}

    def _client_error(self, returncode: int, stderr: str) -> TransportError | None:
        if returncode == 0:
            return None
        return match_error(ADB_RULES, _client_lines(stderr), self._error_fields)

    def _only_device(self) -> str:
        """With no serial given, the one attached device; several or none is an error."""
        rc, out, err = self._run_client(self._adb("devices"), ["adb", "devices"], timeout=60)
        rows = [line.split() for line in out.decode(errors="replace").splitlines()[1:] if line.strip()]
        serials = [row[0] for row in rows if len(row) >= 2]
        if len(serials) == 1:
            return serials[0]
        if not serials:
            raise DeviceNotFoundError(f"no adb device is connected (see `adb{self._error_fields()['port_flag']} "
                                      "devices`); plug one in or pass a serial")
        raise DeviceNotFoundError(f"several adb devices are connected ({', '.join(serials)}); "
                                  "pass a serial or set ANDROID_SERIAL")

    def _launch(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None) -> Launch:
        # adb joins its arguments with spaces and hands them to the phone's shell, like ssh:
        # one pre-quoted line keeps every argument intact.
        return self._adb("shell", remote_command(argv, cwd, env))

    def connect(self) -> None:
        """Check the device is online and authorised, and that it reports exit codes."""
        rc, out, err = self._run_client(self._adb("features"), ["adb", "features"], timeout=60)
        if rc != 0:
            raise TransportError(f"cannot talk to {self.device_id}: {err.strip() or f'adb exited {rc}'}")
        if "shell_v2" not in out.decode(errors="replace").split():
            raise TransportError(f"{self.device_id} is too old for hydra-edge: its adb has no shell "
                                 "protocol (exit codes), which needs Android 7 or newer")

    @contextmanager
    def _forwarding(self, remote_port: int, local_port: int) -> Iterator[None]:
        """``adb forward --no-rebind tcp:LOCAL tcp:REMOTE``, removed on leaving.

        The adb server holds the forward (there is no client process to stop), so it is removed by its
        local port; ``--no-rebind`` never takes over a forward someone else made on that port.
        """
        local = f"tcp:{local_port}"
        argv = ["adb", "forward", "--no-rebind", local, f"tcp:{remote_port}"]
        rc, out, err = self._run_client(self._adb(*argv[1:]), argv, timeout=60)
        if rc != 0:
            raise self._forward_failed(rc, out.decode(errors="replace") + err, FORWARD_BIND_FAILED, local_port,
                                       remote_port, "the adb")
        try:
            yield
        finally:
            self._run_client(self._adb("forward", "--remove", local), ["adb", "forward", "--remove", local], timeout=30)

    def _upload(self, local: Path, remote: str) -> None:
        self._sync("push", str(local), remote, remote, f"copying {local} to")

    def _download(self, remote: str, local: Path) -> None:
        self._sync("pull", remote, str(local), remote, "copying from")

    def _sync(self, verb: str, src: str, dst: str, remote: str, doing: str) -> None:
        """``adb push``/``adb pull``; they print their errors on stdout as often as on stderr."""
        rc, out, err = self._run_client(self._adb(verb, src, dst), ["adb", verb, src, dst])
        if rc != 0:
            said = out.decode(errors="replace") + err
            raise self._client_error(rc, said) or self._transfer_error(said, remote, doing)

    def install(self, apk: Path) -> None:
        """``adb install -r APK``: the phone's package manager installs it, replacing an app of its
        package (data kept). The client's own failures (offline, not found) are its one-line errors;
        the package manager's refusal is ``InstallRefusedError`` with its code."""
        argv = ["adb", "install", "-r", str(apk)]
        rc, out, err = self._run_client(self._adb(*argv[1:]), argv, timeout=INSTALL_TIMEOUT_S)
        said = out.decode(errors="replace") + err
        if rc == 0 and "Success" in said:
            return
        failure = re.search(r"Failure \[([A-Z_]*)(?::\s*)?([^\]]*)\]", said)
        if failure:
            code = failure.group(1)
            reason = f"{code}: {failure.group(2)}" if code and failure.group(2) else (code or failure.group(2))
            raise InstallRefusedError(f"{self.device_id} refused to install {apk.name}: {reason}", code, reason)
        lines = [line for line in said.strip().splitlines() if line.strip()]
        raise InstallRefusedError(f"installing {apk.name} on {self.device_id} failed (exit {rc}): "
                                  f"{lines[-1] if lines else 'no error text'}")
