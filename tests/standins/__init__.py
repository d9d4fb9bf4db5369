"""Test stand-ins for devices that cannot exist on a CI machine.

``sshd`` starts a real OpenSSH server on loopback (a Linux board's side); ``adbd`` is a small
ADB protocol peer that the real ``adb`` client drives (a phone's side). Each module also offers
pytest fixtures; every process is started in its own process group and stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, alive: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Block until something accepts on 127.0.0.1:port; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before listening on port {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:g} s")


def stop_process(proc: subprocess.Popen) -> None:
    """Stop a stand-in started with ``start_new_session=True``: TERM its group, then KILL.

    The group matters for sshd, whose per-connection children outlive the listener.
    """
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; give stragglers in its group the same signal
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        break


def running(marker: str) -> list[str]:
    """Command lines of live processes on this machine (every stand-in device's too) naming ``marker``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it ended while we looked
        if marker in text:
            found.append(text)
    return found


def gone(marker: str, within_s: float) -> bool:
    """Whether every process naming ``marker`` has ended within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not running(marker)
