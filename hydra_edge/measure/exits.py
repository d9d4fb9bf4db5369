"""A device command's own exit status, printed by the device's shell right after it ends.

Over ssh a runner killed by its runtime and a connection that dropped can both end the client
with 255, and the client's stderr may hold only the runtime's chatter. The status line tells
them apart whatever the transport: it arrives when the runner died (recorded as crashed), and
is missing when the connection dropped (nothing recorded, so the next run measures it again).
"""

from __future__ import annotations

import json
from typing import Optional

from ..transport.base import host_watch

# The command reads the stdin the host holds open, and is stopped when it ends (``host_watch``: a
# native binary cannot watch for its host itself); then the device's sh prints the status.
_REPORTING_EXIT = host_watch("<&3 3<&-") + '; printf \'\\n{"event": "exit", "code": %d}\\n\' "$?"'


def reporting_exit(argv: list[str]) -> list[str]:
    """``argv`` run by the device's ``sh``, which then prints ``{"event": "exit", "code": N}`` on a
    line of its own; run it as a stream (stdin held open): the command is stopped when stdin ends."""
    return ["sh", "-c", _REPORTING_EXIT, "sh", *argv]


def exit_code(line: str) -> Optional[int]:
    """The status if ``line`` is the status line, else None."""
    if not line.startswith('{"event": "exit"'):
        return None
    try:
        return int(json.loads(line)["code"])
    except (ValueError, KeyError, TypeError):
        return None


def split_exit(stdout: str) -> tuple[str, Optional[int]]:
    """A finished command's output without its status line, and the status (None: it never came)."""
    head, _, last = stdout.rstrip("\n").rpartition("\n")
    code = exit_code(last)
    return (head, code) if code is not None else (stdout, None)
