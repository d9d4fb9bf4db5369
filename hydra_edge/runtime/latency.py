"""Latency statistics: summarising our own timings, and parsing the native runners' output.

A stock phone has no Python, so there the timings come from TFLite's ``benchmark_model`` or
ExecuTorch's ``executor_runner``, and a Jetson's TensorRT engines are timed by ``trtexec``; each is
read into the same ``LatencyStats`` (in ms) that the Python runner computes, so the lookup table
never knows which produced a row.
"""

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

from .signals._text import EQUALS_TOKENS, NUMBER, integer, number, pairs

TRIM_FRACTION = 0.1  # trimmed mean drops 10% at each end: one-off stalls, not the model


@dataclass(frozen=True)
class LatencyStats:
    """Latency over ``count`` runs, in ms. A native runner may leave some fields None."""

    count: int
    mean_ms: float
    std_ms: Optional[float] = None
    min_ms: Optional[float] = None
    max_ms: Optional[float] = None
    p50_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    trimmed_mean_ms: Optional[float] = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation, as numpy's default computes it.

    The interpolation is numpy's own two-sided form (from the lower value below the midpoint, from the
    upper one above it), which never leaves ``[lower, upper]``: ``a * (1 - w) + b * w`` lands a rounding
    error below a window of equal timings (13.8 ms x 20 gave 13.799999999999999), and then no timing is
    at or below the p90 the latency loop divides by. The Kotlin library computes it the same way.
    """
    position = (len(sorted_values) - 1) * (q / 100.0)
    low, high = math.floor(position), math.ceil(position)
    weight = position - low
    a, b = sorted_values[low], sorted_values[high]
    return b - (b - a) * (1.0 - weight) if weight >= 0.5 else a + (b - a) * weight


def trimmed_mean(sorted_values: Sequence[float], fraction: float = TRIM_FRACTION) -> float:
    """Mean after cutting ``int(fraction * n)`` values at each end (as scipy's ``trim_mean``)."""
    cut = int(fraction * len(sorted_values))
    return statistics.fmean(sorted_values[cut:len(sorted_values) - cut])


def summarize_latencies(seconds: Sequence[float]) -> LatencyStats:
    """Summarise per-run latencies given in seconds into ms.

    ``std_ms`` is the population standard deviation, as benchmark_model reports it, so the
    Python and native rows compare like with like.
    """
    if not seconds:
        raise ValueError("summarize_latencies needs at least one latency")
    ms = sorted(value * 1e3 for value in seconds)
    return LatencyStats(
        count=len(ms),
        mean_ms=statistics.fmean(ms),
        std_ms=statistics.pstdev(ms),
        min_ms=ms[0],
        max_ms=ms[-1],
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        trimmed_mean_ms=trimmed_mean(ms),
    )


@dataclass(frozen=True)
class NativeBenchmark:
    """What a native runner printed: steady-state latency plus start-up costs and memory."""

    tool: str
    succeeded: bool
    latency: Optional[LatencyStats]
    init_ms: Optional[float] = None
    first_ms: Optional[float] = None
    warmup_mean_ms: Optional[float] = None
    memory_init_mb: Optional[float] = None
    memory_overall_mb: Optional[float] = None
    memory_peak_mb: Optional[float] = None
    # Each timed run's time, where the output holds them: what a calibration by rounds needs for the
    # p90's interval (aggregates alone cannot give it)
    latencies_ms: Optional[List[float]] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _line_after(text: str, marker: str) -> Optional[str]:
    """The rest of the first line that contains ``marker``, or None."""
    match = re.search(re.escape(marker) + r"(.*)", text)
    return match.group(1) if match else None


# benchmark_model -----------------------------------------------------------------------------
# Each "Running benchmark for at least ..." run (warm-up, then the measured one) ends with one
# Stat line in µs: "count=50 first=1234 curr=1200 min=1100 max=1300 avg=1200.5 std=30", or
# "count=50 curr=1200(all same)" when every run took the same time. It prints no percentiles
# (tensorflow/core/util/stats_calculator.h, Stat::OutputToStream), so those stay None.
_TFLITE_RUN = "Running benchmark for at least"
_TFLITE_TIMINGS = "Inference timings in us:"
_TFLITE_TIMING = re.compile(r"([A-Za-z][\w ()]*?):\s*([^,\s]+)")


# Its per-run times: a Stat line names the first and the newest run ("first", "curr"), so a run of at
# most two timed runs prints each of them; more runs print aggregates only.
TFLITE_RUNS_SHOWN = 2


def _tflite_stat(run_output: str) -> tuple[Optional[LatencyStats], Optional[List[float]]]:
    """The Stat line's statistics and, when it names every run (``TFLITE_RUNS_SHOWN``), their times (ms)."""
    stat_line = next((line for line in run_output.splitlines() if "count=" in line), "")
    fields = pairs(EQUALS_TOKENS, stat_line)
    count = integer(fields.get("count"))
    if not count:
        return None, None
    us = {key: number(value, 1e-3) for key, value in fields.items()}
    if us.get("avg") is None:  # the "(all same)" form
        us.update(avg=us.get("curr"), first=us.get("curr"), min=us.get("curr"), max=us.get("curr"), std=0.0)
    if us["avg"] is None:
        return None, None
    runs = None
    if count <= TFLITE_RUNS_SHOWN and us.get("first") is not None and us.get("curr") is not None:
        runs = [us["curr"]] if count == 1 else [us["first"], us["curr"]]
    return LatencyStats(count=count, mean_ms=us["avg"], std_ms=us.get("std"),
                        min_ms=us.get("min"), max_ms=us.get("max")), runs


def parse_benchmark_model(text: str) -> NativeBenchmark:
    """Parse TFLite ``benchmark_model`` output (stdout and stderr together).

    The latency is the second run's Stat line (the first is the warm-up); the summary line
    ``Inference timings in us: Init: .., First inference: .., Warmup (avg): ..`` gives the
    start-up costs, and ``--report_peak_memory_footprint`` adds the peak memory line.
    """
    runs = text.split(_TFLITE_RUN)[1:]
    timings = pairs(_TFLITE_TIMING, _line_after(text, _TFLITE_TIMINGS))
    memory = pairs(EQUALS_TOKENS, _line_after(text, "Memory footprint delta from the start"))
    latency, each = _tflite_stat(runs[1]) if len(runs) > 1 else (None, None)
    return NativeBenchmark(
        tool="benchmark_model",
        succeeded=bool(timings),
        latency=latency,
        latencies_ms=each,
        init_ms=number(timings.get("Init"), 1e-3),
        first_ms=number(timings.get("First inference"), 1e-3),
        warmup_mean_ms=number(timings.get("Warmup (avg)"), 1e-3),
        memory_init_mb=number(memory.get("init")),
        memory_overall_mb=number(memory.get("overall")),
        memory_peak_mb=number(_line_after(text, "Overall peak memory footprint (MB)")),
    )


# executor_runner -----------------------------------------------------------------------------
# examples/portable/executor_runner logs (ET_LOG, "I 00:00:00.001234 executorch:file:line] ..."):
#   "Model loaded in 12.345000 ms."               (newer builds)
#   "Iteration 3 of 10: 11.230000 ms"             (newer builds, one per --num_executions)
#   "Model executed successfully 10 time(s) in 112.300000 ms."  or, in old builds, just
#   "Model executed successfully."
_ET_LOADED = re.compile(rf"Model loaded in ({NUMBER}) ms")
_ET_ITERATION = re.compile(rf"Iteration \d+ of \d+: ({NUMBER}) ms")
_ET_DONE = re.compile(rf"Model executed successfully(?: (\d+) time\(s\) in ({NUMBER}) ms)?")


def parse_executor_runner(text: str) -> NativeBenchmark:
    """Parse ExecuTorch ``executor_runner`` output (its log goes to stderr).

    Per-iteration lines give full statistics; without them the total over N executions gives
    the mean only; an old runner that prints neither gives ``latency=None``.
    """
    iterations_ms = [float(value) for value in _ET_ITERATION.findall(text)]
    done = _ET_DONE.search(text)
    loaded = _ET_LOADED.search(text)
    return NativeBenchmark(
        tool="executor_runner",
        succeeded=done is not None,
        latency=_executorch_latency(iterations_ms, done),
        init_ms=float(loaded.group(1)) if loaded else None,
        first_ms=iterations_ms[0] if iterations_ms else None,
        latencies_ms=iterations_ms or None,
    )


def _executorch_latency(iterations_ms: List[float], done: Optional["re.Match[str]"]
                        ) -> Optional[LatencyStats]:
    if iterations_ms:
        return summarize_latencies([value * 1e-3 for value in iterations_ms])
    if done is None or done.group(1) is None or int(done.group(1)) == 0:
        return None
    count = int(done.group(1))
    return LatencyStats(count=count, mean_ms=float(done.group(2)) / count)


# trtexec -------------------------------------------------------------------------------------
# TensorRT's samples/common/sampleReporting.cpp, after the run ("[I]" log lines):
#   "Engine deserialized in 0.0033933 sec."
#   "Timing trace has 55177 queries over 3.00005 s"
#   "Latency: min = 0.0334 ms, max = 0.88 ms, mean = 0.0432 ms, median = 0.0387 ms,
#    percentile(90%) = 0.0481 ms, percentile(95%) = 0.0548 ms, percentile(99%) = 0.144 ms"
#   "&&&& PASSED TensorRT.trtexec [TensorRT v101600] ..."   (FAILED when it did not run)
# "Latency" is the host's end to end (H2D, GPU compute, D2H): what a caller waits for, as the
# Python runner times. "H2D Latency" / "D2H Latency" lines are its parts, so the match is anchored.
_TRT_QUERIES = re.compile(r"Timing trace has (\d+) queries")
_TRT_LATENCY = re.compile(r"(?:^|\] )Latency: (.*)$", re.MULTILINE)
_TRT_STAT = re.compile(rf"(min|max|mean|median|percentile\((?:90|99)%\)) = ({NUMBER}) ms")
_TRT_DESERIALIZED = re.compile(rf"Engine deserialized in ({NUMBER}) sec")


def parse_trtexec(text: str) -> NativeBenchmark:
    """Parse TensorRT ``trtexec`` output: latency from its performance summary, the engine's
    deserialisation as its load; no std or trimmed mean (it prints neither)."""
    line = _TRT_LATENCY.search(text)
    stats = dict(_TRT_STAT.findall(line.group(1))) if line else {}
    queries = _TRT_QUERIES.search(text)
    latency = None
    if queries and "mean" in stats:
        ms = {key: float(value) for key, value in stats.items()}
        latency = LatencyStats(count=int(queries.group(1)), mean_ms=ms["mean"], min_ms=ms.get("min"),
                               max_ms=ms.get("max"), p50_ms=ms.get("median"), p90_ms=ms.get("percentile(90%)"),
                               p99_ms=ms.get("percentile(99%)"))
    loaded = _TRT_DESERIALIZED.search(text)
    return NativeBenchmark(tool="trtexec", succeeded="&&&& PASSED TensorRT.trtexec" in text, latency=latency,
                           init_ms=float(loaded.group(1)) * 1e3 if loaded else None)


def parse_trtexec_times(text: str) -> Optional[List[float]]:
    """Each timed query's ``latencyMs`` from the file ``trtexec --exportTimes`` writes (a JSON list, one
    object per query, warm-ups left out; the same end-to-end latency its summary's "Latency" line
    summarises); None when the text is not such a list or a value is not a finite, non-negative number."""
    try:
        queries = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(queries, list) or not queries:
        return None
    values = [q.get("latencyMs") if isinstance(q, dict) else None for q in queries]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        return None
    return [float(v) for v in values]
