"""A hydra-edge command on the host driving a board over ssh, and what it left running on the board.

``start_host`` runs the command in a process of its own, as a user does, so a test can Ctrl-C or kill
it; ``on_board`` finds the board's processes (those the stand-in sshd started) by a marker, and
``stop_host_and_check_the_board`` stops the host and fails the test if anything it started there lives on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .processes import cmdline, descendants
from .sshd import SshServer


def start_host(command: str, *args: object) -> subprocess.Popen:
    """``hydra-edge COMMAND ARGS`` in a process of its own, as a user runs it; output in ``stdout``."""
    module = {"calibrate": "hydra_edge.commands.calibrate", "deploy": "hydra_edge.commands.deploy"}[command]
    code = f"from {module} import {command}; {command}({[str(a) for a in args]!r})"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def on_board(server: SshServer, marker: str) -> list[int]:
    """Processes sshd started (the board's side) whose command line names ``marker``."""
    return [pid for pid in descendants(server.pid) if marker in cmdline(pid)]


def stop_host_and_check_the_board(host: subprocess.Popen, how: str, server: SshServer, marker: str) -> str:
    """Ctrl-C (SIGINT, what the terminal sends) or SIGKILL the host; return its output once it has
    exited, after checking nothing it started on the board still runs."""
    assert on_board(server, marker)  # the board process runs: stopping it below is what is tested
    try:
        if how == "ctrl-c":
            host.send_signal(signal.SIGINT)
            output, _ = host.communicate(timeout=15)  # "returns at once": generous, it used to hang
        else:
            host.kill()
            output, _ = host.communicate(timeout=15)
        deadline = time.monotonic() + 10
        while on_board(server, marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = on_board(server, marker)
        assert not left, [cmdline(pid) for pid in left]
    finally:
        if host.poll() is None:
            host.kill()
        for pid in on_board(server, marker):
            os.kill(pid, signal.SIGKILL)
    return output
