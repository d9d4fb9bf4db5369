"""Conversion workers die with the ``convert`` that started them.

A ``convert -j 2`` killed with SIGKILL (the OOM killer, ``kill -9``, a CI job's timeout) cannot stop its
workers itself; each holds torch and the converters (hundreds of MB). They must not live on,
reparented to PID 1 and blocked on a pipe no one will write again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Set

import pytest
import torch
from support.targets import ONNX_FP32

from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT

pytestmark = pytest.mark.slow  # starts worker processes that import torch and the converters


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Depth-1 digits HydraViT with random weights and no data spec: verified on random inputs, quick to export."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("random") / "digits.pt"
    HydraViT(preset("digits", depth=1, heads=(3, 6, 12))).save(path)
    return path


def descendants(pid: int) -> Set[int]:
    """Every living process below ``pid`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):  # gone while read
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is still a process that runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for(condition: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s:g} s: {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("when", ["starting", "converting"])
def test_sigkill_of_a_parallel_convert_takes_its_workers_with_it(checkpoint: Path, tmp_path: Path,
                                                                 when: str) -> None:
    """SIGKILL ``convert -j 2`` while its workers import (``starting``) or once the first artefact landed
    (``converting``: one worker mid-export, the other waiting on its queue): within seconds no process it
    started runs on."""
    target, out = tmp_path / "host.toml", tmp_path / "bundle"
    target.write_text(ONNX_FP32)
    proc = subprocess.Popen([sys.executable, "-m", "hydra_edge.cli", "convert", "-c", str(checkpoint), "-t",
                             str(target), "-o", str(out), "--heads", "3-8", "--eval-limit", "8", "--layout", "full",
                             "-j", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: Set[int] = set()
    try:
        def started() -> bool:
            assert proc.poll() is None, "convert ended before it was killed"
            workers.update(descendants(proc.pid))
            return len(workers) >= 2 and (when == "starting" or bool(list(out.glob("vit_h*.onnx"))))

        wait_for(started, 240, f"convert -j 2 {when}")
        workers.update(descendants(proc.pid))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    try:
        wait_for(lambda: not any(alive(pid) for pid in workers), 15, f"workers {sorted(workers)} gone")
    finally:
        for pid in workers:  # the test's own leftovers, should it fail: never outlive it
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
