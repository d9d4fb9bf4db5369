"""How many conversion worker processes this machine can hold, and what each one used.

A worker holds torch, the converters, the model and the converter's intermediate graphs; converting
the b16 model to .pte or .tflite peaks at several GiB, so on a small host more workers than memory
allows would swap or be killed. The default ``--jobs`` is therefore the smaller of the cores and
what the available memory holds at the estimate below; an explicit ``--jobs`` always wins.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

from ..runtime import memory

# Peak resident memory of one worker ~ BASE + PER_WEIGHT_BYTE x the fp32 model's bytes: the base is
# torch and the converters; the factor is the largest measured run's (every head count of the three
# targets in two workers), rounded up, so --jobs never starts more workers than memory holds. The
# measured peaks are in docs/benchmarks.md ("Conversion worker memory").
WORKER_BASE_BYTES = 3 << 28  # 0.75 GiB
WORKER_BYTES_PER_WEIGHT_BYTE = 18


@dataclass(frozen=True)
class Jobs:
    """The worker count chosen, and the one line that says why (shown before converting)."""

    n: int
    why: str


def cores() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def available_bytes() -> int:
    """Memory the kernel can give without swapping (MemAvailable); free pages where that is unknown."""
    known = memory.available_bytes()
    return known if known is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def worker_bytes(model_bytes: int) -> int:
    """Estimated peak memory of one worker converting a model of ``model_bytes`` fp32 weights."""
    return WORKER_BASE_BYTES + WORKER_BYTES_PER_WEIGHT_BYTE * model_bytes


def choose_jobs(asked: int | None, pending: int, model_bytes: int) -> Jobs:
    """``asked`` when given; else as many workers as cores, memory and pending artefacts allow (at least 1)."""
    gib = 2**30
    if asked is not None:
        return Jobs(asked, f"{asked} worker{'s' if asked > 1 else ''} (--jobs {asked})")
    n_cores, avail, each = cores(), available_bytes(), worker_bytes(model_bytes)
    n = max(1, min(n_cores, avail // each, pending))
    return Jobs(n, f"{n} worker{'s' if n > 1 else ''} (default --jobs: {n_cores} cores, {avail / gib:.1f} GiB "
                   f"available, ~{each / gib:.1f} GiB per worker, {pending} artefacts to make)")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
