"""Processes and ports on this machine: what a test starts, waits for, finds and stops.

Every stand-in device (``sshd``, ``adbd``) and every host command a test starts is a process of its
own; these helpers pick its port, wait until it listens, stop it by its PID and its group, and find
what is still running (by a marker on its command line or below a PID) once it should have ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


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
    lines = (cmdline(int(proc.name)) for proc in Path("/proc").glob("[0-9]*"))
    return [line for line in lines if marker in line]


def gone(marker: str, within_s: float) -> bool:
    """Whether every process naming ``marker`` has ended within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not running(marker)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: sshd's per-connection children start their own sessions, so
    killing the listener's group leaves them (and the runner they started) alive."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid``, words joined by spaces; empty once it has ended."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@contextmanager
def held_elsewhere(lock_file: Path) -> Iterator[subprocess.Popen]:
    """Another hydra-edge process holding ``lock_file`` until the block ends."""
    code = ("import sys\nfrom pathlib import Path\nfrom hydra_edge.lock import exclusive\n"
            f"with exclusive(Path({str(lock_file)!r}), 'it'):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "--the-holder"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
