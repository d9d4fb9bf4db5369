"""Runtime libraries' own output goes to a log file; a device program's warnings and errors stay on the terminal.

LiteRT, XNNPACK and onnxruntime print banners and notices from C++ straight to file descriptor 2
(LiteRT's "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." whenever an interpreter is
made, on whichever thread makes it), so rebinding ``sys.stderr`` cannot hold them back.
``native_output_to`` points descriptor 2 itself at a log for the rest of the process and gives
Python's ``sys.stderr`` a descriptor of its own on the original stderr: the program's warnings,
its one-line errors and any traceback still reach the user, while what the libraries print is
kept in the log. ``HYDRA_EDGE_VERBOSE`` (set by ``hydra-edge -v`` and inherited by the programs it
starts) also copies the log to the terminal.

Torch-free and host-free, like the rest of ``hydra_edge.runtime``: device programs use it, and the
host's converter logs (``hydra_edge.logs``) share its verbosity switch and its tee.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path

VERBOSE = "HYDRA_EDGE_VERBOSE"


def verbose() -> bool:
    """Whether the user asked to see what converters and runtimes print (``hydra-edge -v``)."""
    return os.environ.get(VERBOSE, "") not in ("", "0")


def native_output_to(log: Path, title: str) -> None:
    """From now on, what this process writes to descriptor 2 goes to ``log`` (started afresh, with
    ``title`` and the time on its first line); ``sys.stderr`` stays on the terminal.

    Call it before anything keeps a reference to ``sys.stderr`` (``logging.basicConfig``). Raises
    ``OSError`` when the log cannot be written; nothing has moved then.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.write(fd, f"# {title}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
    sys.stderr.flush()
    terminal = os.dup(2)
    sys.stderr = open(terminal, "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                      errors="backslashreplace")
    if verbose():
        tee = Tee(fd, terminal)
        os.dup2(tee.write_end, 2)
        atexit.register(_drain, tee)
    else:
        os.dup2(fd, 2)
        os.close(fd)


def _drain(tee: "Tee") -> None:
    """At exit, let the tee copy what is still in its pipe: descriptor 2 is its last writer but one."""
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
