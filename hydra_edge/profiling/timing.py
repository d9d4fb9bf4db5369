"""Latencies that two runtimes' numbers can be compared by, and what host they were measured on.

``paired_ms`` interleaves single runs of several functions (each started once this process's
threads are idle), so that all of them see the same load on a shared host; ``host_cpu`` and
``cpu_family`` name the CPU (int8 speed-ups hinge on its dot-product extensions).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

from hydra_edge.convert.workers import cores


def paired_ms(fns: dict[str, Callable[[], Any]], runs: int, warmup: int = 3) -> dict[str, float]:
    """Median ms of each function, runs interleaved so that both see the same load on a shared host.

    Each run starts once this process's threads are idle (``_settle``): several runtimes' thread
    pools spin-wait after an inference returns, and on a 2-core host a 2-thread run that starts
    beside the previous runtime's spinning thread is slowed by it, the more so the shorter it is.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            _settle()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def _settle(window_s: float = 0.005, busy: float = 0.2, quiet: int = 3, limit_s: float = 1.0) -> None:
    """Wait until this process uses under ``busy`` of one core in ``quiet`` windows of ``window_s`` in a
    row (at most ``limit_s``): on a loaded host a spinning thread can be off the CPU for one window.

    Measured with 2 threads on a 197x3072x3072 FC layer, a runtime's threads keep a core busy after
    the call returns: onnxruntime's for about 60 ms, torch's (OpenMP) for about 8 ms, ExecuTorch's
    for about 4 ms, LiteRT's not at all. Timed back to back, the FC layer right after torch's ran
    beside its spinning thread for most of its 6-9 ms and its 2-thread rate came out low.
    """
    end, still = time.perf_counter() + limit_s, 0
    while time.perf_counter() < end and still < quiet:
        cpu = time.process_time()
        time.sleep(window_s)
        still = still + 1 if time.process_time() - cpu < busy * window_s else 0


def host_cpu() -> str:
    """CPU model and its int8 dot-product extensions: int8 speed-ups hinge on VNNI (x86) or dotprod (arm)."""
    model, flags = _cpuinfo()
    found = sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"})
    return f"{model}, {cores()} cores usable, int8-relevant flags: {', '.join(found) or 'none'}"


def bf16_flags() -> str:
    """The CPU's bf16 instructions: bf16 autocast's matmuls run at their rate only with them."""
    return ", ".join(sorted(_cpuinfo()[1] & {"avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16"})) or "none"


def _cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags, from /proc/cpuinfo (x86 ``flags``, arm ``Features``)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU", set()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith(("flags", "Features"))), []))
    return model, flags


def cpu_family() -> str:
    """Vendor, family and model numbers from /proc/cpuinfo: "AMD EPYC" alone does not say which generation."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        return "unknown"
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
