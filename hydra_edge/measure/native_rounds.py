"""A native benchmark binary timed by the calibration plan, run from the host: the rounds, the stop rule and
the thermal gate the Python runner follows on a board (``calibration_plan``), with each block of runs one
invocation of the binary.

A device without Python cannot run the plan itself, so the host runs it over the transport: each round
waits on the gate (the device's state read with the profile's commands and ``dumpsys``), then visits the
open head counts in a new random order, invoking the binary once per head count. The p90's interval needs
each run's time, and each tool gives them its own way (``native.NativeTool``): ``executor_runner`` prints
one line per iteration, ``trtexec`` writes them to its ``--exportTimes`` file, and ``benchmark_model``
shows two per invocation at most (its Stat line's first and newest run), so its blocks are two runs each,
every invocation paying its load and warm-up again (counted toward the cap, never in the timings). The
others' blocks hold enough runs for ``block_s`` at the head count's mean so far.

Each round, block and result goes to ``Sink`` as it comes (the journal saves it), so Ctrl-C or a dropped
link keeps every block timed and the next run goes on from them.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import msgspec

from ..calibration_plan import MIN_BLOCK_RUNS, Gate, StopRule, Tally, interleave
from ..records.calibration import Block, Calibration, HeadResult, Round
from ..records.manifest import ArtefactRecord
from ..runtime.signals import DeviceState
from .journal import BlockEntry
from .native import NativeRun, NativeTool, head_result

MAX_BLOCK_RUNS = 10_000  # one invocation's runs at most: its output (a line per run) stays a few hundred kB

Invoke = Callable[[ArtefactRecord, int, int], NativeRun]  # (artefact, runs, warm-up runs): one invocation


class Sink(Protocol):
    """Where the rounds go as they are timed: the calibration's record writer and progress."""

    def put_round(self, round_: Round) -> None: ...

    def put_block(self, entry: BlockEntry) -> None: ...

    def put_result(self, result: HeadResult) -> None: ...


@dataclass
class _Head:
    """One head count in the rounds: its tally, its state before its first block, its start-up costs."""

    artefact: ArtefactRecord
    tally: Tally
    before: DeviceState | None = None
    first: NativeRun | None = None  # its first invocation in this run: its load time
    peak_mb: float | None = None


def block_runs(tool: NativeTool, tally: Tally, block_s: float, rule: StopRule) -> int:
    """Runs for a head count's next invocation: what the tool shows each of, else ``block_s`` of runs at
    its mean so far (``MIN_BLOCK_RUNS`` before it has one), never past the most runs a head count keeps."""
    left = max(1, rule.max_runs - len(tally.sorted_s))
    if tool.most_runs_shown is not None:
        return min(tool.most_runs_shown, left)
    if not tally.sorted_s:
        return min(MIN_BLOCK_RUNS, left)
    mean = tally.timed_s / len(tally.sorted_s)
    # runs of no measurable time (or so short that block_s / mean overflows) ask for the most an invocation holds
    wanted = MAX_BLOCK_RUNS if mean <= 0 or block_s / mean >= MAX_BLOCK_RUNS else math.ceil(block_s / mean)
    return min(max(MIN_BLOCK_RUNS, wanted), left)


def resumed(artefact: ArtefactRecord, calibration: Calibration, rule: StopRule) -> Tally:
    """A head count's tally from the blocks an interrupted calibration saved of it (none: a fresh one)."""
    tally = Tally(artefact.heads)
    held = calibration.result(artefact.heads)
    if held is not None and held.status == "timing" and held.sha256 == artefact.sha256:
        for block in held.blocks or []:
            tally.add(block.round, [v / 1e3 for v in block.latencies_ms], block.spent_s)
        tally.judge(rule)
    return tally


def time_in_rounds(todo: list[ArtefactRecord], calibration: Calibration, tool: NativeTool, run: Invoke,
                   state: Callable[[], DeviceState], rule: StopRule, gate: Gate, block_s: float,
                   warmup: tuple[int, int], first_round: int, sink: Sink,
                   on_block: Callable[[int, int], None] = lambda round_no, heads: None,
                   rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
    """Time ``todo`` in interleaved, gated rounds until each head count's timing stops; ``on_block(round,
    heads)`` after each block (progress). Every invocation is a new process, so each warms up: a head
    count's first with ``warmup[0]`` untimed runs (the calibration's ``--warmup``), the later ones with
    ``warmup[1]`` (the plan's block warm-up). A head count whose invocation fails, or whose tool shows no
    per-run times, gets an error result and leaves the rounds; the others go on."""
    heads = {a.heads: _Head(a, resumed(a, calibration, rule)) for a in todo}

    def time_block(count: int) -> list[float]:
        head = heads[count]
        if head.before is None:
            head.before = state()
        done = run(head.artefact, block_runs(tool, head.tally, block_s, rule),
                   warmup[0] if head.first is None else warmup[1])
        if done.error is None and not done.latencies_ms:
            done = NativeRun(done.parsed, None, f"{tool.name} printed no time for each run (only aggregates), "
                             "which a p90's interval needs; use a build that prints them (executor_runner: one "
                             "with per-iteration lines; trtexec: one with --exportTimes), or the Python runner")
        if done.error is not None:
            head.tally.stopped = "error"
            sink.put_result(head_result(tool, head.artefact, done, head.before, state()))
            return []
        head.first = head.first or done
        peaks = [p for p in (head.peak_mb, done.parsed.memory_peak_mb) if p is not None]
        head.peak_mb = max(peaks) if peaks else None
        return [v / 1e3 for v in done.latencies_ms or []]

    def block_done(tally: Tally) -> None:
        head = heads[tally.heads]
        if tally.stopped == "error":  # its result was put as it failed
            return
        a = head.artefact
        sink.put_block(BlockEntry(a.heads, a.id, a.sha256, tool.name, msgspec.convert(tally.blocks[-1], Block)))
        on_block(tally.blocks[-1]["round"], a.heads)
        if tally.stopped:
            finish(head)

    def finish(head: _Head) -> None:
        result = head_result(tool, head.artefact, head.first, head.before, state())
        sink.put_result(msgspec.structs.replace(
            result, latency=head.tally.latency(), peak_rss_mb=head.peak_mb, stopped=head.tally.stopped,
            blocks=[msgspec.convert(b, Block) for b in head.tally.blocks]))

    for head in heads.values():  # resumed with enough already
        if head.tally.stopped:
            finish(head)

    def put_round(event: dict[str, Any]) -> None:
        sink.put_round(msgspec.convert(event, Round))

    interleave({h: head.tally for h, head in heads.items()}, time_block, rule, clock,
               rng or random.Random(), gate, first_round=first_round, on_round=put_round, on_block=block_done)
