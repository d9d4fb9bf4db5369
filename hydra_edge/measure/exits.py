"""A device command's own exit status, printed by the device's shell right after it ends.

Over ssh a runner killed by its runtime and a connection that dropped can both end the client
with 255, and the client's stderr may hold only the runtime's chatter. The status line tells
them apart whatever the transport: it arrives when the runner died (recorded as crashed), and
is missing when the connection dropped (nothing recorded, so the next run measures it again).
"""

from __future__ import annotations

import json
from typing import Optional

# The device's sh runs the command in the background (its stdin still the host's) and a watcher
# reads the stdin the host holds open: at its end (Ctrl-C, a killed host, a dropped link) the
# watcher stops the command, which a native binary cannot do for itself. The watcher writes
# nowhere, so it never keeps a channel open.
_REPORTING_EXIT = ('exec 3<&0; "$@" <&3 & pid=$!; '
                   '{ cat <&3 >/dev/null 2>&1; kill -TERM "$pid" 2>/dev/null; } >/dev/null 2>&1 & '
                   'wait "$pid"; printf \'\\n{"event": "exit", "code": %d}\\n\' "$?"')


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
