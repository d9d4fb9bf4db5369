"""The latency loop against a real slow-down: the same scripted CPU load with and without the loop.

Converts a preset model (random weights) for one target variant (``full_and_compact``, as
bench/switch_latency.py makes it), calibrates this machine as the device (``hydra-edge calibrate
--local``), and builds a lookup table whose budget the largest head count meets unloaded (its p90
over ``--warmup-s`` unloaded here x ``--headroom``). Then, twice (loop off, loop on), this process is pinned to one
core and classifies without pause on a cool, charging simulated board (a fake sysfs tree) while
a busy-looping process is started on the same core, by its PID, after ``--before-s`` and stopped
after ``--load-s`` more; ``--after-s`` follow. Each inference is timed where the app times it.
Per run: the share of inferences over budget (all, and while loaded), the held-out accuracy
delivered (the table's accuracy per head count, weighted by the time it ran), the switches and
their reasons; a timeline of head count, latency, budget and load. Writes closed_loop.{json,md,png}.

    .venv/bin/python bench/closed_loop.py --preset mini --before-s 20 --load-s 60 --after-s 60
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from switch_latency import calibrate_here

from hydra_edge.lut.make import make_lut
from hydra_edge.measure.journal import read_calibration
from hydra_edge.model.config import parse_heads, preset
from hydra_edge.profiling.bundles import full_and_compact
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.switcher import Switcher

ROOT = Path(__file__).resolve().parents[1]
COOL_C = 40.0
TIMELINE_POINTS = 3000  # per run in the JSON and the figure: every n-th inference (the summary counts them all)
BUSY = "while True: pass"


def cool_board(folder: Path) -> Path:
    """A sysfs tree with one cool thermal zone: the table's largest head count, so the loop alone lowers it."""
    zone = folder / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text(f"{int(COOL_C * 1000)}\n")
    return folder


def run(bundle: Path, board: Path, loop: Optional[LoopSettings], phases: tuple[float, float, float],
        shape: tuple[int, ...], core: int) -> dict[str, Any]:
    """Classify for the three phases; the load process runs on ``core`` in the middle one."""
    x = np.zeros((1, *shape), np.float32)
    before, loaded, after = phases
    samples, load, start = [], None, time.monotonic()
    sw = Switcher(bundle, signals={"thermal": "sysfs"}, root=str(board), threads=1, latency_loop=loop)
    try:
        sw.start()
        while (now := time.monotonic() - start) < before + loaded + after:
            if load is None and before <= now < before + loaded:
                load = subprocess.Popen([sys.executable, "-c", BUSY],
                                        preexec_fn=lambda: os.sched_setaffinity(0, {core}))
            elif load is not None and now >= before + loaded and load.returncode is None:
                load.kill()
                load.wait()
            t = time.perf_counter()
            heads = sw.predict(x).heads
            samples.append((round(now, 4), heads, round((time.perf_counter() - t) * 1e3, 4)))
    finally:
        if load is not None and load.returncode is None:
            load.kill()
            load.wait()
        sw.close()
    status = sw.latency_status()
    return {"loop": loop is not None, "samples": samples,
            "events": [{"time": round(e["time"] - sw.events[0].time, 2), "from": e["from"], "to": e["to"],
                        "reason": e["reason"]} for e in sw.event_log()],
            "ignored": None if status is None else status["ignored"]}


def summarise(row: dict[str, Any], budget: float, accuracy: dict[int, float], phases: tuple[float, float, float]
              ) -> dict[str, Any]:
    t = np.array([s[0] for s in row["samples"]])
    heads = np.array([s[1] for s in row["samples"]])
    ms = np.array([s[2] for s in row["samples"]])
    loaded = (t >= phases[0]) & (t < phases[0] + phases[1])
    spent = np.diff(t, append=t[-1])  # each inference's share of the run: until the next one starts
    delivered = float(sum(accuracy[int(h)] * s for h, s in zip(heads, spent)) / spent.sum())
    return {"loop": row["loop"], "inferences": int(len(ms)),
            "over_budget_pct": round(100 * float((ms > budget).mean()), 2),
            "over_budget_loaded_pct": round(100 * float((ms[loaded] > budget).mean()), 2),
            "p90_loaded_ms": round(float(np.percentile(ms[loaded], 90)), 3),
            "p90_unloaded_ms": round(float(np.percentile(ms[~loaded], 90)), 3),
            "accuracy_delivered": round(delivered, 3), "switches": len(row["events"]) - 1}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # the app and the load share one core
    heads = parse_heads(args.heads, preset(args.preset).num_heads)
    full, _ = full_and_compact(Path(args.work), args.preset, heads, args.target, args.quant, args.eval_images)
    calibration = calibrate_here(full, args.runs, 1, full.parent)
    largest = max(read_calibration(calibration).measured(), key=lambda r: r.heads)
    model = read_manifest(full).model
    shape = (model["in_chans"], model["img_size"], model["img_size"])
    phases = (args.before_s, args.load_s, args.after_s)
    board = cool_board(full.parent / "cool-board")
    # The budget the largest head count meets unloaded as it runs here (pinned, beside the poll thread),
    # which a separate calibration process does not see: its p90 over a short unloaded run x headroom.
    make_lut(full, calibration, full, budget_ms=largest.latency_ms * args.headroom)  # the largest when cool
    warm = run(full, board, None, (args.warmup_s, 0.0, 0.0), shape, core)
    budget = round(float(np.percentile([s[2] for s in warm["samples"] if s[1] == largest.heads], 90))
                   * args.headroom, 4)
    doc = make_lut(full, calibration, full, budget_ms=budget)
    basis, accuracy = doc["accuracy_basis"], {c["heads"]: c["accuracy"] for c in doc["candidates"]}
    rows = []
    for loop in (None, LoopSettings()):  # one host, one script: the rows differ only in the loop
        row = run(full, board, loop, phases, shape, core)
        every = -(-len(row["samples"]) // TIMELINE_POINTS)
        rows.append({**summarise(row, budget, accuracy, phases), "timeline": row["samples"][::every],
                     "events": row["events"], "ignored": row["ignored"]})
        print({k: v for k, v in rows[-1].items() if k != "timeline"}, flush=True)
    return {"model": f"{args.preset} preset, random weights", "target": args.target, "quant": args.quant,
            "format": read_manifest(full).artefacts[-1].format, "host": host_cpu(), "threads": 1,
            "budget_ms": budget, "headroom": args.headroom, "phases_s": list(phases), "accuracy_basis": basis,
            "candidates": [{"heads": c["heads"], "latency_ms": c["latency_ms"], "accuracy": c["accuracy"]}
                           for c in doc["candidates"]], "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    b, l, a = report["phases_s"]
    rows = "".join(f"| {'on' if r['loop'] else 'off'} | {r['inferences']} | {r['over_budget_pct']:.1f} | "
                   f"{r['over_budget_loaded_pct']:.1f} | {r['p90_unloaded_ms']:.3f} | {r['p90_loaded_ms']:.3f} | "
                   f"{r['accuracy_delivered']:.2f} | {r['switches']} |\n" for r in report["rows"])
    reasons = "".join(f"- {e['time']:.1f} s: {e['from']} -> {e['to']} heads: {e['reason']}\n"
                      for r in report["rows"] if r["loop"] for e in r["events"])
    return (f"# The latency loop under a CPU load: {report['model']}, {report['target']} {report['format']} "
            f"{report['quant']}\n\nHost: {report['host']}; one engine thread; this process and a busy-looping "
            f"process pinned to one core. Budget {report['budget_ms']} ms (the largest head count's unloaded p90 "
            f"here x {report['headroom']}); {b:g} s unloaded, {l:g} s loaded, {a:g} s unloaded.\n\n"
            "Candidates: " + ", ".join(f"{c['heads']} heads {c['latency_ms']:.3f} ms ({report['accuracy_basis']} "
                                       f"{c['accuracy']:.2f})" for c in report["candidates"]) + "\n\n"
            f"Accuracy delivered: the table's {report['accuracy_basis']} per head count, weighted by the time "
            "it ran.\n\n| loop | inferences | over budget % | over budget while loaded % | p90 unloaded ms | "
            "p90 loaded ms | accuracy delivered | switches |\n|---|---:|---:|---:|---:|---:|---:|---:|\n" + rows
            + "\nThe loop's switches:\n\n" + reasons)


def plot(report: dict[str, Any]) -> Any:
    """Per run: latency (points) against the budget, the head count (step), the load (shaded)."""
    fig, axes = subplots(len(report["rows"]), 1, figsize=(9, 6), sharex=True)
    b, l, _ = report["phases_s"]
    for ax, row in zip(axes, report["rows"]):
        t, heads, ms = (np.array(v) for v in zip(*row["timeline"]))
        ax.scatter(t, ms, s=1, alpha=0.3, label="latency ms")
        ax.axhline(report["budget_ms"], color="red", lw=1, label="budget")
        ax.axvspan(b, b + l, color="grey", alpha=0.15, label="CPU load on the same core")
        ax.set(ylabel="ms", yscale="log", title=f"loop {'on' if row['loop'] else 'off'}: "
                                                 f"{row['over_budget_loaded_pct']:.0f} % over budget while loaded")
        right = ax.twinx()
        right.step(t, heads, where="post", color="black", lw=1, label="heads")
        right.set(ylabel="heads", ylim=(0, max(heads) + 1))
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set(xlabel="s")
    fig.suptitle(f"{report['model']}, {report['format']} {report['quant']}; {report['host']}", fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini", help="mini (milliseconds an inference) or b16 (the paper's model)")
    p.add_argument("--heads", default="3,6,12")
    p.add_argument("--target", default="jetson")
    p.add_argument("--quant", default="fp32", help="the variant the board runs")
    p.add_argument("--runs", type=int, default=50, help="timed runs per artefact for the calibration")
    p.add_argument("--headroom", type=float, default=1.2, help="budget = the largest head count's unloaded p90 x this")
    p.add_argument("--warmup-s", type=float, default=5.0, help="seconds unloaded that the budget is measured on")
    p.add_argument("--before-s", type=float, default=20.0, help="seconds unloaded before the load starts")
    p.add_argument("--load-s", type=float, default=60.0, help="seconds of load")
    p.add_argument("--after-s", type=float, default=60.0, help="seconds unloaded after it stops")
    p.add_argument("--eval-images", type=int, default=8, help="random inputs each artefact is verified on")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-closed-loop"), help="checkpoint and bundle")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for closed_loop.*")
    args = p.parse_args(argv)
    if args.runs < 1 or not args.headroom >= 1 or min(args.before_s, args.load_s, args.after_s, args.warmup_s) <= 0:
        p.error("--runs must be >= 1, --headroom >= 1 and every phase > 0 s")
    save_report(Path(args.out), "closed_loop", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
