"""A native benchmark binary in the calibration plan, run from the host: each block one invocation, sized
to what the tool shows of each run; rounds gated; a failing or aggregate-only tool is one error result
while the others go on; an interrupted calibration goes on from its journalled blocks. Driven by the
simulated device (a fake clock and engine) with the real record writer; and the parsers that give each
run's time."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_edge.calibration_plan import MIN_BLOCK_RUNS, Gate, GateRule, StopRule, Tally
from hydra_edge.measure.journal import RecordWriter, read_calibration
from hydra_edge.measure.native import TOOLS, NativeRun, NativeTool
from hydra_edge.measure.native_rounds import MAX_BLOCK_RUNS, block_runs, time_in_rounds
from hydra_edge.records.calibration import Calibration, HeadResult, Round
from hydra_edge.records.manifest import ArtefactRecord, read_manifest
from hydra_edge.runtime.latency import (NativeBenchmark, parse_benchmark_model, parse_trtexec_times,
                                        summarize_latencies)
from hydra_edge.runtime.signals import DeviceState

from support.simdevice import SimDevice
from support.tables import fake_bundle

BASE_MS = {3: 4.0, 6: 6.0, 12: 11.0}


def _artefacts(folder: Path, heads: list[int]) -> list[ArtefactRecord]:
    folder.mkdir(exist_ok=True)
    return read_manifest(fake_bundle(folder, heads)).artefacts


class Writer:
    """The session's side of ``native_rounds.Sink``: the real journal."""

    def __init__(self, calibration: Calibration, record: Path) -> None:
        self.writer = RecordWriter(calibration, record)
        self.order: list[tuple[str, int]] = []  # ("round", n) / ("block", heads) / ("result", heads)

    def put_round(self, round_: Round) -> None:
        self.order.append(("round", round_.round))
        self.writer.put_round(round_)

    def put_block(self, entry: Any) -> None:
        self.order.append(("block", entry.heads))
        self.writer.put_block(entry)

    def put_result(self, result: HeadResult) -> None:
        self.order.append(("result", result.heads))
        self.writer.put(result)


class Binary:
    """A native tool on the simulated device: each invocation warms up, then times ``runs`` runs on the
    device's clock; ``fail`` maps a head count to the invocation (1-based) that fails, ``interrupt`` the
    invocation (counted over all) that raises Ctrl-C."""

    def __init__(self, device: SimDevice, tool: NativeTool, fail: dict[int, int] | None = None,
                 interrupt: int | None = None, per_run: bool = True) -> None:
        self.device, self.tool, self.fail, self.interrupt, self.per_run = device, tool, fail or {}, interrupt, per_run
        self.calls: list[tuple[int, int, int]] = []  # (heads, runs, warmup)
        self.peaks: dict[int, list[float]] = {}  # the peak memory each invocation reported, per head count

    def __call__(self, artefact: ArtefactRecord, runs: int, warmup: int) -> NativeRun:
        heads = artefact.heads
        self.calls.append((heads, runs, warmup))
        if self.interrupt is not None and len(self.calls) == self.interrupt:
            raise KeyboardInterrupt
        self.device.sleep(0.05)  # the process starting and loading the model
        for _ in range(warmup):
            self.device.step(heads)
        times = []
        for _ in range(runs):
            start = self.device.clock()
            self.device.step(heads)
            times.append((self.device.clock() - start) * 1e3)
        self.peaks.setdefault(heads, []).append(10.0 + heads + len(self.calls) % 3)
        parsed = NativeBenchmark(self.tool.name, True, summarize_latencies([t / 1e3 for t in times]), init_ms=50.0,
                                 memory_peak_mb=self.peaks[heads][-1])
        if self.fail.get(heads) == sum(1 for h, _, _ in self.calls if h == heads):
            return NativeRun(parsed, None, f"{self.tool.name} exited with 134: Aborted")
        return NativeRun(parsed, times if self.per_run else None, None)


def _run(device: SimDevice, binary: Binary, calibration: Calibration, record: Path, heads: list[int],
         first_round: int = 1, rule: StopRule | None = None) -> Writer:
    sink = Writer(calibration, record)
    gate = Gate(GateRule(), device.state, device.clock, device.sleep)
    try:
        time_in_rounds(_artefacts(record.parent / "bundle", heads), calibration, binary.tool, binary,
                       lambda: DeviceState.from_dict({"timestamp": 0.0, **device.state()}),
                       rule or StopRule(min_runs=50, min_s=1.0, cap_s=60.0), gate, 0.25, (10, 2), first_round,
                       sink, rng=random.Random(0), clock=device.clock)
    finally:
        sink.writer.close()
    return sink


def _calibration() -> Calibration:
    return Calibration(device_id="local:x", device={}, bundle={"manifest_sha256": "0" * 64}, settings={})


def test_each_block_is_one_invocation_until_each_p90_is_known(tmp_path: Path) -> None:
    device = SimDevice(dict(BASE_MS), seed=1)
    binary = Binary(device, TOOLS["executor_runner"])
    sink = _run(device, binary, _calibration(), tmp_path / "cal.json", [3, 6, 12])
    cal = read_calibration(tmp_path / "cal.json")
    for heads in BASE_MS:
        r = cal.result(heads)
        assert r.ok and r.stopped == "interval" and r.runner == "executor_runner" and r.golden["checked"] is False
        calls = [(runs, warmup) for h, runs, warmup in binary.calls if h == heads]
        # the first invocation warms up as --warmup asks and times MIN_BLOCK_RUNS; each later one warms up by
        # the plan's block warm-up and holds 0.25 s of runs at the head count's mean so far
        assert calls[0] == (MIN_BLOCK_RUNS, 10) and {w for _, w in calls[1:]} == {2}
        assert [len(b.latencies_ms) for b in r.blocks] == [runs for runs, _ in calls]
        for i in range(1, len(r.blocks)):
            before = [v for b in r.blocks[:i] for v in b.latencies_ms]
            assert len(r.blocks[i].latencies_ms) == max(MIN_BLOCK_RUNS, math.ceil(250 / (sum(before) / len(before))))
        runs = [v for b in r.blocks for v in b.latencies_ms]
        assert r.latency["count"] == len(runs) >= 50 and r.latency["timed_s"] >= 1.0
        assert r.latency["p90_ms"] == pytest.approx(float(np.percentile(runs, 90)))
        low, high = r.p90_interval_ms
        assert low <= r.latency["p90_ms"] <= high and high - low <= 0.1 * r.latency["p90_ms"]
        assert r.load_s == pytest.approx(0.05) and r.peak_rss_mb == max(binary.peaks[heads])
        assert r.state_before is not None and r.state_after is not None
    # every round recorded before its blocks, numbered from 1, visiting each open head count once
    assert [r.round for r in cal.rounds] == list(range(1, len(cal.rounds) + 1))
    assert sink.order[0] == ("round", 1)
    assert sorted(h for kind, h in sink.order if kind == "result") == [3, 6, 12]
    for r in cal.rounds:
        assert sorted(r.order) == sorted(h for h in BASE_MS if any(b.round == r.round for b in cal.result(h).blocks))


def test_benchmark_model_invocations_time_two_runs_each(tmp_path: Path) -> None:
    """Its Stat line names the first and the newest run: two runs per invocation are each shown."""
    device = SimDevice({3: 4.0}, seed=2)
    binary = Binary(device, TOOLS["benchmark_model"])
    _run(device, binary, _calibration(), tmp_path / "cal.json", [3], rule=StopRule(min_runs=50, min_s=0.2))
    r = read_calibration(tmp_path / "cal.json").result(3)
    assert {runs for _, runs, _ in binary.calls} == {2} and r.ok and r.latency["count"] == 2 * len(binary.calls)


def test_a_failing_invocation_is_one_error_and_the_others_go_on(tmp_path: Path) -> None:
    device = SimDevice(dict(BASE_MS), seed=3)
    binary = Binary(device, TOOLS["executor_runner"], fail={6: 2})
    sink = _run(device, binary, _calibration(), tmp_path / "cal.json", [3, 6, 12])
    cal = read_calibration(tmp_path / "cal.json")
    failed = cal.result(6)
    assert failed.status == "error" and failed.error == "executor_runner exited with 134: Aborted"
    assert sum(1 for h, _, _ in binary.calls if h == 6) == 2  # never invoked again
    assert sum(1 for kind, h in sink.order if (kind, h) == ("block", 6)) == 1  # its first block was saved
    assert cal.result(3).ok and cal.result(12).ok


def test_a_tool_that_prints_no_time_per_run_is_refused_not_summarised(tmp_path: Path) -> None:
    device = SimDevice({3: 4.0}, seed=4)
    binary = Binary(device, TOOLS["executor_runner"], per_run=False)
    _run(device, binary, _calibration(), tmp_path / "cal.json", [3])
    r = read_calibration(tmp_path / "cal.json").result(3)
    assert r.status == "error" and r.latency is None and len(binary.calls) == 1
    assert "printed no time for each run" in r.error and "p90's interval" in r.error


def test_an_interrupted_calibration_goes_on_from_its_blocks(tmp_path: Path) -> None:
    """Ctrl-C part-way keeps every block timed (the journal); the next run numbers its rounds after the last
    and counts those blocks with its own, as if it had never stopped."""
    record = tmp_path / "cal.json"
    device = SimDevice(dict(BASE_MS), seed=5)
    with pytest.raises(KeyboardInterrupt):
        _run(device, Binary(device, TOOLS["executor_runner"], interrupt=8), _calibration(), record, [3, 6, 12])
    kept = read_calibration(record)
    timing = {h: [b.round for b in kept.result(h).blocks] for h in BASE_MS if kept.result(h) is not None}
    assert kept.rounds and all(kept.result(h).status == "timing" for h in timing) and sum(map(len, timing.values())) == 7
    last = max(r.round for r in kept.rounds)
    binary = Binary(device, TOOLS["executor_runner"])
    _run(device, binary, kept, record, [3, 6, 12], first_round=last + 1)
    done = read_calibration(record)
    assert [r.round for r in done.rounds] == list(range(1, len(done.rounds) + 1))
    for heads in BASE_MS:
        r = done.result(heads)
        assert r.ok and r.stopped == "interval"
        assert [b.round for b in r.blocks][:len(timing.get(heads, []))] == timing.get(heads, [])
        assert all(b.round > last for b in r.blocks[len(timing.get(heads, [])):])
        assert r.latency["count"] == sum(len(b.latencies_ms) for b in r.blocks)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(TOOLS)), timed=st.lists(st.floats(0, 10.0), max_size=60),
       block_s=st.floats(0, 100.0), max_runs=st.integers(1, 40_000))
def test_an_invocation_asks_for_runs_its_tool_shows_within_the_most_kept(name: str, timed: list[float],
                                                                          block_s: float, max_runs: int) -> None:
    tally = Tally(3)
    if timed:
        tally.add(1, timed, sum(timed))
    runs = block_runs(TOOLS[name], tally, block_s, StopRule(max_runs=max_runs))
    assert 1 <= runs <= MAX_BLOCK_RUNS and runs <= max(1, max_runs - len(timed))
    if TOOLS[name].most_runs_shown is not None:
        assert runs <= TOOLS[name].most_runs_shown
    elif not timed:
        assert runs == min(MIN_BLOCK_RUNS, max_runs)


# --- each run's time, from each tool's output ---------------------------------------------------------------

def _tflite(stat: str) -> str:
    return ("Running benchmark for at least 2 iterations\ncount=2 first=900 curr=800 min=800 max=900 avg=850 std=50\n\n"
            f"Running benchmark for at least 2 iterations\n{stat}\n\n"
            "Inference timings in us: Init: 5000, First inference: 900, Warmup (avg): 850, Inference (avg): 1000\n")


def test_benchmark_model_shows_each_run_of_two_at_most() -> None:
    assert parse_benchmark_model(_tflite("count=2 first=1200 curr=1050 min=1050 max=1200 avg=1125 std=75")
                                 ).latencies_ms == [1.2, 1.05]
    assert parse_benchmark_model(_tflite("count=1 curr=1300(all same)")).latencies_ms == [1.3]
    assert parse_benchmark_model(_tflite("count=2 curr=1000(all same)")).latencies_ms == [1.0, 1.0]
    # three runs: the middle one is not printed, so no run's time is claimed
    assert parse_benchmark_model(_tflite("count=3 first=1 curr=2 min=1 max=5 avg=2.6 std=1")).latencies_ms is None


def test_trtexec_times_file() -> None:
    text = json.dumps([{"startEnqMs": 0, "latencyMs": 0.61, "endToEndMs": 0.7}, {"latencyMs": 1}])
    assert parse_trtexec_times(text) == [0.61, 1.0]
    for bad in ("", "{}", "[]", "[1, 2]", '[{"computeMs": 1}]', '[{"latencyMs": -1}]', '[{"latencyMs": NaN}]',
                '[{"latencyMs": Infinity}]', '[{"latencyMs": true}]', '[{"latencyMs": "1"}]', "[" * 100_000):
        assert parse_trtexec_times(bad) is None, bad


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["latencyMs", "computeMs", "x"]), children, max_size=3)).map(json.dumps)))
def test_trtexec_times_never_raise_and_give_only_finite_non_negative_times(text: str) -> None:
    times = parse_trtexec_times(text)
    assert times is None or (times and all(math.isfinite(t) and t >= 0 for t in times))


# --- one invocation on a device (this machine, through the local transport) ---------------------------------

# executor_runner's log layout (newer builds): a line per iteration, the warm-up ones first.
FAKE_EXECUTOR_RUNNER = r"""#!/bin/sh
n=0
for arg in "$@"; do case "$arg" in --num_executions=*) n="${arg#--num_executions=}" ;; esac; done
echo "I 00:00:00.000100 executorch:executor_runner.cpp:150] Model loaded in 12.500000 ms." >&2
i=1
while [ $i -le "$n" ]; do
  echo "I 00:00:00.001000 executorch:executor_runner.cpp:300] Iteration $i of $n: $i.250000 ms" >&2
  i=$((i + 1))
done
echo "I 00:00:01.000000 executorch:executor_runner.cpp:310] Model executed successfully $n time(s) in 1.0 ms." >&2
"""


def test_an_executor_runner_invocation_runs_the_warm_up_first_and_leaves_it_out_of_the_timings(tmp_path: Path) -> None:
    from hydra_edge.measure.native import invoke
    from hydra_edge.transport import LocalTransport

    binary = tmp_path / "executor_runner"
    binary.write_text(FAKE_EXECUTOR_RUNNER)
    binary.chmod(0o755)
    artefact = _artefacts(tmp_path / "bundle", [3])[0]
    said: list[str] = []
    with LocalTransport(tmp_path / "device") as t:
        run = invoke(t, TOOLS["executor_runner"], str(binary), str(tmp_path / "m.pte"), artefact, 4, 2, 1, said.append)
    # six iterations asked (2 warm-up + 4 timed); the timed ones are iterations 3-6
    assert run.error is None and run.latencies_ms == [3.25, 4.25, 5.25, 6.25]
    assert run.parsed.init_ms == 12.5 and any("Iteration 6 of 6" in line for line in said)


def test_a_trtexec_invocation_reads_its_times_file_and_removes_it(tmp_path: Path) -> None:
    from hydra_edge.measure.native import invoke
    from hydra_edge.transport import LocalTransport

    binary = tmp_path / "trtexec"
    binary.write_text("#!/bin/sh\n"
                      "for arg in \"$@\"; do case \"$arg\" in --exportTimes=*) f=\"${arg#--exportTimes=}\" ;; esac; done\n"
                      "printf '[{\"latencyMs\": 0.5}, {\"latencyMs\": 0.75}]' > \"$f\"\n"
                      "echo '[I] Timing trace has 2 queries over 0.01 s'\n"
                      "echo '[I] Latency: min = 0.5 ms, max = 0.75 ms, mean = 0.625 ms, median = 0.625 ms'\n"
                      "echo '&&&& PASSED TensorRT.trtexec [TensorRT v101600]'\n")
    binary.chmod(0o755)
    artefact = _artefacts(tmp_path / "bundle", [3])[0]
    model = tmp_path / "m.onnx"
    with LocalTransport(tmp_path / "device") as t:
        run = invoke(t, TOOLS["trtexec"], str(binary), str(model), artefact, 2, 2, 1, lambda line: None)
    assert run.error is None and run.latencies_ms == [0.5, 0.75]
    assert not Path(f"{model}.times.json").exists()  # the bundle's folder holds only the bundle
