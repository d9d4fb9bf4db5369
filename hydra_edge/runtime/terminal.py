"""What reaches a terminal: text made safe to print, and the stop signals a command treats alike.

Class names, file names, sensor names and whatever a device prints are data, not terminal commands:
a class named ``"\\x1b]0;owned\\x07"`` would set the terminal's title each time it is printed, one
with a newline would forge a log line, a U+202E would show the rest of a line reversed. ``shown``
writes every such character as a visible escape (``\\x1b``, ``\\n``, ``\\u202e``), so each string is
one line of plain text however it was made; rich's markup in it is escaped too where rich prints it
(``rich_shown``). Backslashes are kept as they are, so ``shown`` of ``shown`` text is the same text
(the host shows what a device's app already made safe without doubling it).

``stop_on_signals`` makes SIGTERM (systemd's stop, ``kill``, a supervisor's) do what Ctrl-C does:
raise ``KeyboardInterrupt`` in the main thread, so the same ``except``/``finally`` that keep a
summary and stop children run for either.

Standard library only: the board app imports this on a device without torch or rich.
"""

from __future__ import annotations

import logging
import signal
import threading
import unicodedata
from types import FrameType
from typing import Any, Callable, Dict, Optional

# Categories never shown as they are: controls (C0, DEL, C1: ESC starts CSI and OSC sequences, 0x9b and
# 0x9d are their one-byte forms), format characters (bidi overrides and isolates, zero-width spaces, BOM),
# line and paragraph separators, and lone surrogates (a non-UTF-8 file name decoded with surrogateescape).
HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs"}
# Format characters that are part of ordinary text: the joiners some scripts and emoji sequences need.
KEPT = {"\u200c", "\u200d"}
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(char: str) -> str:
    """One hidden character as the escape a person reads: ``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``."""
    if char in NAMED:
        return NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: object) -> str:
    """``text`` (anything ``str`` takes) as one line a terminal prints as it reads, never obeys.

    Printable ASCII, the common case, is returned as it is without looking at each character.
    """
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_visible(c) if c not in KEPT and unicodedata.category(c) in HIDDEN else c for c in text)


def shown_lines(text: str) -> str:
    """Text of several lines (what a process printed) with each line ``shown``; its newlines kept."""
    return "".join(shown(line) + "\n" for line in text.splitlines())


def rich_shown(text: object) -> str:
    """``shown`` text for rich to print: its ``[...]`` markup escaped too, so ``[link=...]`` or
    ``[blink]`` in a name is printed, not followed (rich is imported only here: a host display)."""
    from rich.markup import escape

    return escape(shown(text))


StopHandler = Callable[[int, Optional[FrameType]], Any]


def stop_on_signals(once: bool = False) -> Dict[int, Any]:
    """SIGTERM (and SIGINT) raise ``KeyboardInterrupt`` in the main thread; returns the handlers replaced.

    ``once``: the first signal stops and any later SIGINT or SIGTERM is ignored, so a second ``kill``
    (or Ctrl-C reaching a process also signalled by its parent) cannot cut the summary and log that
    the first one's ``finally`` writes; SIGKILL still ends it. Does nothing outside the main thread
    (Python delivers signals only there): returns ``{}``. A signal ignored when the process started
    (SIGINT for a job started in the background with ``&``, as ``deploy --detach`` starts the app)
    stays ignored. Once stopping, SIGCHLD does nothing for good: the process is ending.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: Optional[FrameType]) -> None:
        if once:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)
        # children the same stop reached (it went to the whole process group: Ctrl-C, systemd, ``timeout``)
        # end with it: a SIGCHLD handler that reports them (torch's DataLoader raises "worker killed by
        # signal: Terminated" from it, up to the loader's last clean-up as the process exits) would raise
        # over the summary this stop writes, so it is replaced for the rest of the process by one that does
        # nothing (not by SIG_DFL: a SIGCHLD already pending then ends in "Signal 17 ignored due to race
        # condition", printed as a traceback)
        signal.signal(signal.SIGCHLD, _children_end_with_the_stop)
        raise KeyboardInterrupt

    return {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)
            if signal.getsignal(s) is not signal.SIG_IGN}


def _children_end_with_the_stop(signum: int, frame: Optional[FrameType]) -> None:
    """SIGCHLD once a command is stopping: a child's end is part of the stop, not news (see ``stop_on_signals``)."""


def restore_signals(previous: Dict[int, Any]) -> None:
    """Put back the handlers ``stop_on_signals`` replaced."""
    for s, handler in previous.items():
        signal.signal(s, handler)


class ShownFormatter(logging.Formatter):
    """A logging formatter whose every record is ``shown``: a warning naming a file, a sensor or a class
    is one line of plain text whatever those names hold."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))
