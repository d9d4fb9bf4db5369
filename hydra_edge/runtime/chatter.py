"""Runtime libraries' own output goes to a log file; a device program's warnings and errors stay on the terminal.

LiteRT, XNNPACK and onnxruntime print banners and notices from C++ straight to file descriptor 2
(LiteRT's "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." whenever an interpreter is
made, on whichever thread makes it), and ExecuTorch's own log lines ("[cpuinfo_utils.cpp:...]")
reach descriptor 1 through C's stdout, so rebinding ``sys.stdout`` and ``sys.stderr`` cannot hold
them back. ``native_output_to`` points descriptors 1 and 2 themselves at a log for the rest of the
process and gives Python's ``sys.stdout`` and ``sys.stderr`` descriptors of their own on the
originals: the program's lines, its warnings, its one-line errors and any traceback still reach the
user, while what the libraries print is kept in the log, their Python warnings (torch's deprecation
notices as ExecuTorch imports it) too. ``HYDRA_EDGE_VERBOSE`` (set by ``hydra-edge -v`` and
inherited by the programs it starts) also copies the log to the terminal.

Torch-free and host-free, like the rest of ``hydra_edge.runtime``: device programs use it, and the
host's converter logs (``hydra_edge.logs``) share its verbosity switch and its tee.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TextIO

VERBOSE = "HYDRA_EDGE_VERBOSE"


def verbose() -> bool:
    """Whether the user asked to see what converters and runtimes print (``hydra-edge -v``)."""
    return os.environ.get(VERBOSE, "") not in ("", "0")


def open_log(log: Path, title: str, fresh: bool = True) -> int:
    """A descriptor appending to ``log`` (started afresh unless ``fresh`` is false), ``title`` and the time
    written as its first line. ``O_APPEND``: concurrent writers never overwrite one another."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0), 0o644)
    os.write(fd, log_header(title).encode())
    return fd


def log_header(title: str) -> str:
    """Every log's first line: what wrote it, and when."""
    return f"# {title}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"


def native_output_to(log: Path, title: str) -> None:
    """From now on, what this process writes to descriptors 1 and 2, and the Python warnings it shows, go to
    ``log`` (started afresh, with ``title`` and the time on its first line); ``sys.stdout`` and ``sys.stderr``
    stay on the terminal.

    Call it before anything keeps a reference to ``sys.stdout`` or ``sys.stderr`` (``logging.basicConfig``).
    Raises ``OSError`` when the log cannot be written; nothing has moved then.
    """
    fd = open_log(log, title)
    sys.stdout = _own_descriptor(sys.stdout, 1)
    sys.stderr = _own_descriptor(sys.stderr, 2)
    tee = Tee(fd, sys.stderr.fileno()) if verbose() else None
    for descriptor in (1, 2):
        os.dup2(fd if tee is None else tee.write_end, descriptor)
    if tee is None:
        os.close(fd)
    else:
        atexit.register(_drain, tee)
    warnings.showwarning = _warning_to_log


def _own_descriptor(stream: TextIO, descriptor: int) -> TextIO:
    """``stream`` (flushed) reopened, line-buffered, on a copy of ``descriptor``: where it goes now, whatever
    ``descriptor`` is pointed at later."""
    stream.flush()
    return open(os.dup(descriptor), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                errors="backslashreplace")


def _warning_to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning`` once the libraries' output is logged: a library's Python warning is its
    chatter too (the program's own warnings are logging records, on ``sys.stderr``), so it goes to
    descriptor 2, the log."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    os.write(2, text.encode("utf-8", "backslashreplace"))


def _drain(tee: "Tee") -> None:
    """At exit, let the tee copy what is still in its pipe: descriptors 1 and 2 are its last writers but one."""
    os.dup2(sys.stdout.fileno(), 1)
    os.dup2(sys.stderr.fileno(), 2)
    tee.close()


class Tee:
    """A pipe whose reader thread copies what arrives to a log and to the terminal (``-v``)."""

    def __init__(self, log_fd: int, terminal_fd: int) -> None:
        self._read, self.write_end = os.pipe()
        self._thread = threading.Thread(target=self._copy, args=(log_fd, terminal_fd), daemon=True)
        self._thread.start()

    def _copy(self, log_fd: int, terminal_fd: int) -> None:
        while chunk := os.read(self._read, 65536):
            os.write(log_fd, chunk)
            os.write(terminal_fd, chunk)

    def close(self) -> None:
        """Close the write end; once no other descriptor holds the pipe, the reader sees its end."""
        os.close(self.write_end)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            os.close(self._read)
