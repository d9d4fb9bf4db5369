"""Artefacts made in spawned worker processes, and what keeps a Ctrl-C from losing or half-writing one.

On Ctrl-C the workers stop (an artefact being made is dropped, one being renamed into place is
finished) and every artefact that did finish is recorded before the interrupt goes on; temporary
files an interrupt or a killed run left behind are removed (``remove_stale``). A parent killed
outright (SIGKILL, the OOM killer) cannot stop its workers: each dies with it (``die_with_parent``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import __version__
from ..formats import FORMATS
from ..logs import LOGS, capture
from ..records.manifest import MANIFEST, ArtefactRecord
from .artefact import run_job
from .formats import exporter
from .options import Report
from .plan import Job
from .workers import peak_rss_bytes

WORKERS_LOG = "workers.log"  # what the conversion workers' imports print, in the first bundle's logs/
Finish = Callable[[Job, "tuple[ArtefactRecord, int] | None", "BaseException | None"], None]


def remove_stale(out: Path) -> None:
    """Temp files of a killed or interrupted run (atomic writes never expose them); call with the
    bundle locked and no worker running."""
    for stale in [*out.glob(".vit_h*.tmp"), *out.glob(f".{MANIFEST}.*.tmp")]:
        stale.unlink(missing_ok=True)


class Commit:
    """Ctrl-C between an artefact's rename and its manifest record would leave a file the manifest
    does not list; from ``hold()`` to the end of the block, SIGINT is noted instead and acted on
    after (``then``: by default KeyboardInterrupt), and so is SIGTERM where the process treats it as
    Ctrl-C (a command's main process: a handler is installed; a worker keeps SIGTERM's default, so
    terminating it still ends it). Before ``hold()`` they interrupt as usual, and the artefact's
    temporary file is removed."""

    def __init__(self, then: Callable[[], None] | None = None) -> None:
        self.interrupted = False
        self._then = then
        self._previous: dict[int, Any] = {}

    def hold(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            held = [signal.SIGINT] + [signal.SIGTERM] * callable(signal.getsignal(signal.SIGTERM))
            self._previous = {signum: signal.signal(signum, self._note) for signum in held}

    def _note(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def __enter__(self) -> "Commit":
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self.interrupted and exc[0] is None:
            (self._then or _raise_interrupt)()


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


class _Worker:
    """A conversion worker process's state. SIGINT (Ctrl-C reaches the whole process group; the
    parent relays it through ``stop`` otherwise) interrupts the artefact being made, or, while the
    worker is idle or committing, makes it refuse further artefacts."""

    reports: Any = None
    busy = False
    stopping = False

    @classmethod
    def on_sigint(cls, signum: int, frame: Any) -> None:
        cls.stopping = True
        if cls.busy:
            raise KeyboardInterrupt

    @classmethod
    def stop(cls) -> None:
        cls.stopping = True


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it exits
ORPHAN_POLL_S = 0.5  # how often a worker looks for its parent where the kernel cannot tell it


def die_with_parent(parent: int) -> None:
    """End this worker when ``parent`` (the pid that started it) is gone, however it went.

    A SIGKILLed ``convert`` cannot stop its workers, and each holds torch and a model (hundreds of
    MB) while it waits on a pipe no one will write again. On Linux the kernel sends SIGKILL the
    moment the parent dies (``PR_SET_PDEATHSIG``); everywhere, a thread also exits the worker once
    its parent pid has changed (reparented), which covers a parent that died before this call.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(1)  # nothing to finish: the parent that would record this worker's artefacts is gone


def _relay(stop: Any) -> None:
    """Turn the parent's ``stop`` event into this worker's own SIGINT."""
    stop.wait()
    os.kill(os.getpid(), signal.SIGINT)


def _worker_init(parent: int, torch_threads: int, reports: Any, stop: Any, modules: tuple[str, ...],
                 log: str) -> None:
    """Once per worker: its lifetime tied to ``parent``'s, signals, torch's threads, and the converters and
    runtimes its artefacts use imported here (seconds each), not per artefact. What they print on import
    (absl's and oneDNN's banners, torchao's missing CUDA kernels, deprecation warnings) goes to ``log``,
    shared by the workers."""
    die_with_parent(parent)  # first: the imports below take seconds, a parent may be killed meanwhile
    signal.signal(signal.SIGINT, _Worker.on_sigint)
    _Worker.reports = reports
    threading.Thread(target=_relay, args=(stop,), daemon=True).start()
    with capture(Path(log), f"hydra-edge {__version__}: worker {os.getpid()} importing {', '.join(modules)}",
                 fresh=False):
        import torch

        torch.set_num_threads(torch_threads)
        for name in modules:
            import_module(name)


def warm_modules(jobs: Sequence[Job]) -> tuple[str, ...]:
    """Exporter, converter and runtime modules the artefacts of ``jobs`` need, each once."""
    formats = dict.fromkeys(job.variant.format for job in jobs)
    return tuple(dict.fromkeys(name for fmt in formats
                               for name in (FORMATS[fmt].exporter, *exporter(fmt).IMPORTS, FORMATS[fmt].module)))


def _run_in_worker(job: Job) -> tuple[ArtefactRecord, int]:
    """The record, and this worker's peak resident memory so far."""
    with Commit(then=_Worker.stop) as commit:
        _Worker.busy = True
        try:
            if _Worker.stopping:
                raise KeyboardInterrupt
            record = run_job(job, lambda file, stage, size: _Worker.reports.put((file, stage, size)), commit.hold)
            return record, peak_rss_bytes()
        finally:
            _Worker.busy = False


def run_parallel(jobs: list[Job], n: int, torch_threads: int, report: Report, finish: Finish) -> None:
    """Independent artefacts in ``n`` spawned processes; stage reports come back over a queue.

    On Ctrl-C the workers stop (an artefact being made is dropped, one being renamed into place
    is finished) and every artefact that did finish is recorded before the interrupt goes on.
    """
    ctx = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools mid-use
    reports, stop = ctx.Queue(), ctx.Event()
    log = Path(jobs[0].out) / LOGS / WORKERS_LOG  # beside the references' log
    log.unlink(missing_ok=True)  # this run's workers append to it
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                             initargs=(os.getpid(), torch_threads, reports, stop, warm_modules(jobs), str(log))) as pool:
        futures: dict[Future, Job] = {pool.submit(_run_in_worker, job): job for job in jobs}
        recorded: set[Future] = set()

        def record_finished() -> None:
            for future, job in futures.items():
                if future.done() and not future.cancelled() and future not in recorded:
                    recorded.add(future)
                    error = future.exception()
                    if not isinstance(error, KeyboardInterrupt):  # stopped by Ctrl-C: not a failure
                        finish(job, None if error else future.result(), error)

        try:
            while len(recorded) < len(futures):
                wait(set(futures) - recorded, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(reports, report)
                with Commit() as commit:
                    commit.hold()
                    record_finished()
        except KeyboardInterrupt:
            with Commit() as commit:  # a second Ctrl-C must not lose what the workers finished
                commit.hold()
                stop.set()
                for future in futures:
                    future.cancel()
                wait(futures)
                _drain(reports, report)
                record_finished()
            raise


def _drain(reports: Any, report: Report) -> None:
    while True:
        try:
            report(*reports.get_nowait())
        except queue.Empty:
            return
