"""Reaching a device: this machine, a board over ssh, or a phone over adb, behind one interface.

The calibrator sees only ``Transport`` (run, stream, push, pull, ...), so the same code drives
every kind of device. ``open_transport`` picks the kind from what the user named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import HydraEdgeError
from .adb import AdbTransport
from .base import Stream, Transport
from .errors import (
    AuthenticationError,
    ConnectionLostError,
    DeviceNotFoundError,
    DeviceUnauthorizedError,
    HostKeyError,
    IntegrityError,
    NoSpaceError,
    RemoteCommandError,
    RemoteFileNotFoundError,
    ToolMissingError,
    TransportError,
    TransportInterrupted,
    TransportTimeout,
    UnreachableError,
)
from .local import LocalTransport
from .result import Result
from .ssh import SshTransport

__all__ = [
    "open_transport", "DeviceArg", "Transport", "Result", "Stream", "LocalTransport", "SshTransport", "AdbTransport",
    "TransportError", "ToolMissingError", "HostKeyError", "UnreachableError", "AuthenticationError",
    "ConnectionLostError", "DeviceNotFoundError", "DeviceUnauthorizedError", "NoSpaceError",
    "RemoteFileNotFoundError", "IntegrityError", "TransportTimeout", "TransportInterrupted",
    "RemoteCommandError",
]


def open_transport(host: str | None = None, serial: str | None = None, local: bool = False,
                   **options: Any) -> Transport:
    """Open and check a transport to one device.

    ``host`` (``user@host[:port]`` or an ssh config alias) means ssh, ``serial`` (or
    ``ANDROID_SERIAL`` when nothing else is named) means adb, ``local`` this machine. Options
    go to the transport (ssh: port, identity_file, known_hosts, ssh_config, connect_timeout,
    remote_dir; adb: adb_port, remote_dir; local: workdir). The device is contacted before
    this returns, so a wrong host, key or serial fails here with a one-line message.
    """
    named = [name for name, given in (("host", host), ("serial", serial), ("local", local)) if given]
    if len(named) > 1:
        raise HydraEdgeError(f"name one device, not {' and '.join(named)}")
    if local:
        transport: Transport = LocalTransport(**options)
    elif host:
        transport = SshTransport(host, **options)
    elif serial or os.environ.get("ANDROID_SERIAL"):
        transport = AdbTransport(serial, **options)
    else:
        raise HydraEdgeError("name a device: an ssh host, an adb serial (or ANDROID_SERIAL), or local")
    try:
        transport.connect()
    except BaseException:
        transport.close()
        raise
    return transport


@dataclass(frozen=True)
class DeviceArg:
    """One device named on the command line (``--host``, ``--serial`` or ``--local``), as ``open_transport``
    keywords; not a target profile (``convert.targets.Target``), which says what a kind of device runs."""

    kind: str  # "host" | "serial" | "local"
    name: str | None

    def open(self, options: dict[str, Any]) -> Transport:
        if self.kind == "local":
            return open_transport(local=True, **({"workdir": options["remote_dir"]} if "remote_dir" in options else {}))
        keys = {"host": ("identity_file", "known_hosts", "ssh_config", "remote_dir"),
                "serial": ("adb_port", "remote_dir")}[self.kind]
        return open_transport(**{self.kind: self.name}, **{k: v for k, v in options.items() if k in keys})
