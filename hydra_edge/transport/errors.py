"""Transport errors: one class per thing a user can fix, each with a one-line message.

All of them are ``HydraEdgeError``s, so the CLI prints the message and exits non-zero; callers
that care (the fleet calibrator retrying one board) catch the narrow class.
"""

from __future__ import annotations

from ..errors import HydraEdgeError
from .result import Result


class TransportError(HydraEdgeError):
    """Talking to the device failed."""


class ToolMissingError(TransportError):
    """The client program (ssh, adb) is not installed on this machine."""


class HostKeyError(TransportError):
    """The device's ssh host key is unknown or has changed; checking stays on."""


class UnreachableError(TransportError):
    """The device cannot be reached: refused, timed out, unknown name, no route."""


class AuthenticationError(TransportError):
    """The device refused our credentials."""


class ConnectionLostError(TransportError):
    """The connection dropped while a command was running."""


class DeviceNotFoundError(TransportError):
    """No adb device with that serial (or none at all, or several and no serial given)."""


class DeviceUnauthorizedError(DeviceNotFoundError):
    """The adb device is attached but has not accepted this computer's key."""


class NoSpaceError(TransportError):
    """The device has no room for a file."""


class RemoteFileNotFoundError(TransportError):
    """A path asked for on the device does not exist."""


class IntegrityError(TransportError):
    """A copied file's sha256 differs between this machine and the device."""


class TransportTimeout(TransportError):
    """A device command ran past its time limit and was stopped."""


class TransportInterrupted(TransportError):
    """The user pressed Ctrl-C while a device command ran."""


class RemoteCommandError(TransportError):
    """A device command exited non-zero while the caller asked for success."""

    def __init__(self, message: str, result: Result) -> None:
        super().__init__(message)
        self.result = result
