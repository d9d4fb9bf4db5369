"""Converter chatter goes to a log file per artefact; the terminal keeps progress and results.

The converters and runtimes print banners and warnings from C++ (absl, oneDNN, XNNPACK, MLIR)
straight to file descriptors 1 and 2, so redirecting ``sys.stdout`` is not enough: ``capture``
points the descriptors themselves at the log for the length of one artefact, and Python's own
streams (``warnings`` and ``logging`` write to them, absl's Python logging included) with them.
Nothing is filtered out: the log holds everything, and a failure's one-line error names the log.
``-v`` (``HYDRA_EDGE_VERBOSE=1``, inherited by worker processes) also copies it all to the terminal.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import threading
from pathlib import Path
from typing import IO, Callable, Iterator

from .runtime.chatter import VERBOSE, Tee, log_header, open_log, verbose

LOGS = "logs"  # in the bundle folder

_terminal: IO[str] | None = None


def artefact_log(out: Path, file: str) -> Path:
    """``<bundle>/logs/vit_h6_tflite_int8-dynamic.log``: the converter output of one artefact."""
    return out / LOGS / f"{Path(file).stem}.log"


def device_log(record: Path) -> Path:
    """``calibration/logs/<device>.log`` for ``calibration/<device>.json``: what the device's runner printed."""
    return record.parent / LOGS / f"{record.stem}.log"


class LineLog:
    """Lines a device command prints besides its results (a runtime's banners and warnings), appended
    to a log as they arrive, from any thread; with ``verbose()`` each is also handed to ``echo``."""

    def __init__(self, path: Path, title: str, echo: Callable[[str], None]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8", errors="replace", buffering=1)
        self._file.write(log_header(title))
        self._echo = echo if verbose() else None
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            if self._file.closed:  # a stderr reader that outlived its command's stream: nothing to keep
                return
            self._file.write(text + "\n")
            if self._echo:
                self._echo(text)

    def __enter__(self) -> "LineLog":
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._file.close()


def set_verbose(on: bool) -> None:
    """Through the environment, so conversion worker processes and device runners inherit it."""
    if on:
        os.environ[VERBOSE] = "1"


def terminal() -> IO[str]:
    """A stream on the terminal that stays there while ``capture`` redirects stdout and stderr:
    progress displays write here. Where stderr is no file (a test's ``CliRunner``), stderr itself."""
    global _terminal
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, io.UnsupportedOperation, ValueError):
        return sys.stderr
    if _terminal is None:
        _terminal = open(os.dup(fd), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                         errors="replace")
    return _terminal


def _flush() -> None:
    """Python's buffers and C stdio's (``fflush(NULL)``), so output lands on the side it was written on."""
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s}.values():
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # no C runtime to flush where symbols cannot be looked up so
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def capture(log: Path, title: str, fresh: bool = True) -> Iterator[None]:
    """Send everything this process prints (fd 1 and 2, Python streams) to ``log`` until the block
    ends, also by an exception or Ctrl-C; with ``verbose()`` also to the terminal.

    The log is written with ``O_APPEND``, so concurrent writers never overwrite one another. It is
    started afresh (it says what the latest attempt did) unless ``fresh`` is false: worker processes
    sharing one log append to it, and whoever starts them removes the last run's.
    """
    terminal()  # opened before the descriptors move, so it stays on the terminal
    fd = open_log(log, title, fresh)
    _flush()
    saved = os.dup(1), os.dup(2)
    streams = sys.stdout, sys.stderr
    tee = Tee(fd, saved[1]) if verbose() else None
    try:
        target = tee.write_end if tee else fd
        os.dup2(target, 1)
        os.dup2(target, 2)
        # Python-level writers (warnings, logging's last resort, rich's redirection) go through the
        # process's own streams, which now reach the log too.
        sys.stdout, sys.stderr = sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr
        yield
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        sys.stdout, sys.stderr = streams
        if tee:
            tee.close()
        for f in (*saved, fd):
            os.close(f)
