"""Calibration by rounds against one head count after another, on this machine, with a CPU hog part-way.

Converts a depth-2 digits HydraViT (random weights) with ten head counts (3-12) to fp32 ONNX, loads
every artefact once, and times them in-process with this machine's onnxruntime (1 thread):

- **sequential**: the calibrator before rounds: each head count in turn, 10 warm-up and 50 timed runs;
- **rounds**: ``hydra_edge.calibration_plan`` with the calibrator's defaults (stop at a p90 interval
  within 5 %, at least 50 runs and 1 s, a 60 s cap, blocks of 0.25 s after 2 warm-up runs; no thermal
  gate: this machine reports no temperature).

Each is timed quiet, then again with a CPU hog (one busy process per usable core) that starts half-way
through that method's quiet time and runs to its end; each method ``--repeats`` times. Reported per head
count: the p90 under the hog over the same method's quiet p90 (median of the repeats), the largest of
those ratios over the smallest (1.0: the hog fell on every head count alike; one after another it falls on
the head counts timed last), and each method's quiet wall time (the default calibration's time before
and after). Writes calibration_rounds.{json,md,png} under ``--out``.

    .venv/bin/python bench/calibration_rounds.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from hydra_edge.calibration_plan import StopRule, Tally, interleave, timed_block
from hydra_edge.convert import pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.workers import cores
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.engines import load_golden_pair
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.rebuild import load_record

ROOT = Path(__file__).resolve().parents[1]
HEADS = list(range(3, 13))
TARGET = """name = "bench-host"
threads = 1
[[artefacts]]
format = "onnx"
quant = "fp32"
runtime = "onnxruntime"
runtime_min_version = "1.17"
"""

Step = Callable[[], Any]


def bundle(work: Path) -> Path:
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=2, heads=tuple(HEADS))).save(work / "tiny.pt")
    (work / "target.toml").write_text(TARGET)
    pipeline.convert(ConvertOptions(checkpoint=work / "tiny.pt", target=str(work / "target.toml"),
                                    out=work / "bundle", heads=",".join(map(str, HEADS)), data="digits",
                                    eval_limit=60, jobs=1))
    return work / "bundle"


def steps(folder: Path) -> dict[int, Step]:
    """Each head count's single-image inference, loaded once."""
    out = {}
    for artefact in read_manifest(folder).artefacts:
        engine = load_record(folder, artefact, 1)
        x = load_golden_pair(folder, artefact.golden)["inputs"][:1].astype("float32")
        out[artefact.heads] = (lambda e, v: lambda: e.step(v))(engine, x)
    return out


def sequential(run: dict[int, Step], tick: Callable[[], None]) -> dict[int, float]:
    """Each head count in turn, 10 warm-up and 50 timed runs; ``tick`` before each."""
    p90 = {}
    for heads, step in sorted(run.items()):
        tick()
        for _ in range(10):
            step()
        times = []
        for _ in range(50):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        p90[heads] = percentile(sorted(times), 90) * 1e3
    return p90


def rounds(run: dict[int, Step], tick: Callable[[], None]) -> dict[int, float]:
    """The calibrator's rounds and stop rule; ``tick`` before each block."""
    tallies = {heads: Tally(heads) for heads in run}

    def block(heads: int) -> list[float]:
        tick()
        return timed_block(run[heads], time.perf_counter, 2, 0.25)

    interleave(tallies, block, StopRule(), time.monotonic, random.Random(0))
    return {h: percentile(t.sorted_s, 90) * 1e3 for h, t in tallies.items()}


def _hog(go: Any, spinning: Any) -> None:
    go.wait()
    spinning.set()
    while True:
        pass


Method = Callable[[dict[int, Step], Callable[[], None]], dict[int, float]]


def timed(method: Method, run: dict[int, Step], hog_at_s: float | None) -> tuple[dict[int, float], float]:
    """The method's p90s and wall time; with ``hog_at_s``, a busy process per core from then on (checked
    between head counts or blocks: the processes are started before, idle until then)."""
    go = multiprocessing.Event()
    spinning = [multiprocessing.Event() for _ in range(cores() if hog_at_s is not None else 0)]
    hogs = [multiprocessing.Process(target=_hog, args=(go, started), daemon=True) for started in spinning]
    for process in hogs:
        process.start()
    began = time.monotonic()

    def tick() -> None:
        # Once the time comes, the timing waits until every hog spins: a head count timed in the next
        # few ms (one after another takes ~10 ms each here) then runs against the hog, not its wake-up.
        if hog_at_s is not None and not go.is_set() and time.monotonic() - began >= hog_at_s:
            go.set()
            for started in spinning:
                started.wait()

    try:
        p90 = method(run, tick)
    finally:
        for process in hogs:
            process.kill()
            process.join()
    return p90, time.monotonic() - began


def spread(ratios: dict[str, float]) -> float:
    """Largest over smallest of the head counts' ratios: 1.0 when the hog fell on all of them alike."""
    return max(ratios.values()) / min(ratios.values())


def markdown(report: dict[str, Any]) -> str:
    quiet = {m: ", ".join(f"{s:.1f}" for s in report["quiet_s"][m]) for m in METHODS}
    lines = [f"Host: {report['host']}", "",
             f"Default calibration of {len(HEADS)} head counts, quiet, in each of {report['repeats']} repeats: "
             f"one after another {quiet['sequential']} s; by rounds {quiet['rounds']} s.", "",
             "p90 with the hog part-way over the quiet p90 (median of the repeats):", "",
             "| heads | one after another | rounds |", "|---:|---:|---:|"]
    for h in HEADS:
        lines.append(f"| {h} | {report['ratio']['sequential'][str(h)]:.2f} | {report['ratio']['rounds'][str(h)]:.2f} |")
    lines.append(f"| largest / smallest | {report['spread']['sequential']:.2f} | {report['spread']['rounds']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    fig, ax = subplots(1, 1, figsize=(6, 3.5))
    for method in METHODS:
        ax.plot(HEADS, [report["ratio"][method][str(h)] for h in HEADS], marker="o", label=method)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("heads")
    ax.set_ylabel("p90 with a hog part-way / quiet p90")
    ax.legend()
    return fig


METHODS: dict[str, Method] = {"sequential": sequential, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--repeats", type=int, default=3, help="quiet and hogged runs of each method")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hydra-rounds-") as tmp:
        run = steps(bundle(Path(tmp)))
        report: dict[str, Any] = {"host": host_cpu(), "repeats": args.repeats, "quiet_s": {}, "ratio": {},
                                  "spread": {}, "p90_ms": {}}
        for name, method in METHODS.items():
            report["quiet_s"][name], report["p90_ms"][name], ratios = [], [], []
            for repeat in range(args.repeats):
                quiet, quiet_s = timed(method, run, None)
                hogged, _ = timed(method, run, quiet_s / 2)
                report["quiet_s"][name].append(quiet_s)
                report["p90_ms"][name].append({"quiet": quiet, "hog": hogged})
                ratios.append({h: hogged[h] / quiet[h] for h in HEADS})
                print(f"{name} {repeat + 1}/{args.repeats}: quiet {quiet_s:.1f} s", flush=True)
            report["ratio"][name] = {str(h): statistics.median(r[h] for r in ratios) for h in HEADS}
            report["spread"][name] = spread(report["ratio"][name])
    save_report(args.out, "calibration_rounds", report, markdown, plot)


if __name__ == "__main__":
    main()
