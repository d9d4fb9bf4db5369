"""The latency loop against a real slow-down: the same scripted CPU load with and without the loop.

Converts a preset model (random weights) for one target variant (``full_and_compact``, as
bench/switch_latency.py makes it), calibrates this machine as the device (``hydra-edge calibrate
--local``), and builds a lookup table whose budget the largest head count meets unloaded (its p90
over ``--warmup-s`` unloaded here x ``--headroom``). Then, once without the loop and ``--repeat`` times with it
(``--rows on``: with it only), this process is pinned to one
core and classifies without pause on a cool, charging simulated board (a fake sysfs tree) while
a busy-looping process is started on the same core, by its PID, after ``--before-s`` and stopped
after ``--load-s`` more; ``--after-s`` follow. Each inference is timed where the app times it.
Per run: the share of inferences over budget (all, and while loaded), the held-out accuracy
delivered (the table's accuracy per head count, weighted by the time it ran), the switches and
their reasons; how long after the load started the loop stepped down and how long after it stopped
the largest head count ran again; the p50 and p90 of each head count once the load has gone; a
timeline of head count, latency, budget and load. Writes ``--name``.{json,md,png}.

``--preset digits-b16`` is the digits model at ViT-B/16's widths (12 heads of 64, two blocks,
about 10 ms an inference here): its small head counts take a millisecond or two, so their timings
are noisy relative to their size, the case the loop's return after a load is judged on
(``closed_loop_recovery``):

    .venv/bin/python bench/closed_loop.py --preset mini --before-s 20 --load-s 60 --after-s 60
    .venv/bin/python bench/closed_loop.py --preset digits-b16 --heads 3,12 --quant int8-qdq --headroom 1.6 \\
        --loop-window-s 2 --loop-sustain-s 3 --loop-dwell-s 4 --rows on --before-s 10 --load-s 15 \\
        --after-s 70 --repeat 3 --name closed_loop_recovery
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

import torch

from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.pipeline import convert
from hydra_edge.lut.make import make_lut
from hydra_edge.measure.journal import read_calibration
from hydra_edge.model.config import parse_heads, preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.profiling.bundles import full_and_compact
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.closed_loop import correction_path
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.switcher import Switcher

ROOT = Path(__file__).resolve().parents[1]
COOL_C = 40.0
TIMELINE_POINTS = 3000  # per run in the JSON and the figure: every n-th inference (the summary counts them all)
BUSY = "while True: pass"
WIDE = "digits-b16"  # the digits preset at ViT-B/16's widths, two blocks (as tests/test_board_under_load.py)


def wide_bundle(work: Path, heads: tuple[int, ...], target: str, quant: str, eval_images: int) -> Path:
    """The full bundle of the digits model at ViT-B/16's widths (random weights), converted once under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / f"{WIDE}_random.pt"
    if not ckpt.is_file():
        torch.manual_seed(0)
        HydraViT(preset("digits", depth=2, head_dim=64)).save(ckpt)
    out = work / f"{WIDE}_{target}_{quant}_h{'-'.join(map(str, heads))}" / "full"
    result = convert(ConvertOptions(checkpoint=ckpt, target=target, quant=quant, out=out, layout="full",
                                    heads=",".join(map(str, heads)), eval_limit=eval_images))
    if result.failed:
        raise SystemExit(f"conversion failed: {result.failed[0]}")
    return out


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


def summarise(row: dict[str, Any], budget: float, accuracy: dict[int, float], phases: tuple[float, float, float],
              window_s: float, probe_inferences: int) -> dict[str, Any]:
    t = np.array([s[0] for s in row["samples"]])
    heads = np.array([s[1] for s in row["samples"]])
    ms = np.array([s[2] for s in row["samples"]])
    start, stop = phases[0], phases[0] + phases[1]
    loaded = (t >= start) & (t < stop)
    spent = np.diff(t, append=t[-1])  # each inference's share of the run: until the next one starts
    delivered = float(sum(accuracy[int(h)] * s for h, s in zip(heads, spent)) / spent.sum())
    largest = max(accuracy)
    down = t[(t >= start) & (heads < largest)]
    # back: the first stretch at the largest head count after the step down that outlasts a probe (a probe
    # kept) and lasts past the load (0 s: a probe started while loaded, kept as the load stopped)
    at_largest = np.concatenate(([False], heads == largest, [False]))
    edges = np.flatnonzero(np.diff(at_largest.astype(int)))
    back = [max(0.0, t[a] - stop) for a, b in zip(edges[::2], edges[1::2])
            if len(down) and t[a] > down[0] and t[b - 1] >= stop and b - a > probe_inferences]
    return {"loop": row["loop"], "inferences": int(len(ms)),
            "over_budget_pct": round(100 * float((ms > budget).mean()), 2),
            "over_budget_loaded_pct": round(100 * float((ms[loaded] > budget).mean()), 2),
            "p90_loaded_ms": round(float(np.percentile(ms[loaded], 90)), 3),
            "p90_unloaded_ms": round(float(np.percentile(ms[~loaded], 90)), 3),
            "accuracy_delivered": round(delivered, 3), "switches": len(row["events"]) - 1,
            "down_after_s": round(float(down[0] - start), 2) if len(down) else None,
            "back_after_s": round(float(back[0]), 2) if back else None,
            "largest_at_end": bool(heads[-1] == largest),
            "loaded_ms": by_heads(heads, ms, loaded & (t >= start + window_s)),
            "after_load_ms": by_heads(heads, ms, t >= stop + window_s)}


def by_heads(heads: np.ndarray, ms: np.ndarray, where: np.ndarray) -> dict[int, dict[str, float]]:
    """The p50 and p90 (ms) and the count of the inferences ``where`` selects, per head count that ran."""
    return {int(h): {"p50": round(float(np.percentile(ms[where & (heads == h)], 50)), 3),
                     "p90": round(float(np.percentile(ms[where & (heads == h)], 90)), 3),
                     "inferences": int((where & (heads == h)).sum())} for h in sorted(set(heads[where].tolist()))}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # the app and the load share one core
    if args.preset == WIDE:
        heads = parse_heads(args.heads, preset("digits").num_heads)
        full = wide_bundle(Path(args.work), heads, args.target, args.quant, args.eval_images)
    else:
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
    warm = run(full, board, None, (args.warmup_s, 0.0, 0.0), shape, core)  # the loop off: nothing learned
    budget = round(float(np.percentile([s[2] for s in warm["samples"] if s[1] == largest.heads], 90))
                   * args.headroom, 4)
    doc = make_lut(full, calibration, full, budget_ms=budget)
    basis, accuracy = doc["accuracy_basis"], {c["heads"]: c["accuracy"] for c in doc["candidates"]}
    settings = LoopSettings(window_s=args.loop_window_s, sustain_s=args.loop_sustain_s, dwell_s=args.loop_dwell_s,
                            max_switches_per_minute=args.loop_max_switches)
    rows = []
    # one host, one script: the rows differ only in the loop (and in the host's own noise, hence --repeat)
    for loop in ([] if args.rows == "on" else [None]) + [settings] * args.repeat:
        correction_path(full / "lut.json").unlink(missing_ok=True)  # each run learns from its own timings
        row = run(full, board, loop, phases, shape, core)
        every = -(-len(row["samples"]) // TIMELINE_POINTS)
        rows.append({**summarise(row, budget, accuracy, phases, settings.window_s, settings.probe_inferences),
                     "timeline": row["samples"][::every], "events": row["events"], "ignored": row["ignored"]})
        print({k: v for k, v in rows[-1].items() if k not in ("timeline", "events")}, flush=True)
    back = [r["back_after_s"] for r in rows if r["loop"]]
    return {"label": args.label, "model": f"{args.preset} preset, random weights", "target": args.target,
            "quant": args.quant,
            "format": read_manifest(full).artefacts[-1].format, "host": host_cpu(), "threads": 1,
            "budget_ms": budget, "headroom": args.headroom, "phases_s": list(phases), "accuracy_basis": basis,
            "loop": {"window_s": settings.window_s, "sustain_s": settings.sustain_s, "dwell_s": settings.dwell_s,
                     "max_switches_per_minute": settings.max_switches_per_minute},
            "back_after_s_median": None if None in back else round(float(np.median(back)), 2),
            "candidates": [{"heads": c["heads"], "latency_ms": c["latency_ms"], "accuracy": c["accuracy"]}
                           for c in doc["candidates"]], "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    b, l, a = report["phases_s"]
    loop = report["loop"]

    def seconds(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.1f}"

    def by_heads(stats: dict[Any, dict[str, float]]) -> str:
        return ", ".join(f"{h}: {v['p50']:.2f} / {v['p90']:.2f}" for h, v in stats.items())

    rows = "".join(f"| {'on' if r['loop'] else 'off'} | {r['inferences']} | {r['over_budget_pct']:.1f} | "
                   f"{r['over_budget_loaded_pct']:.1f} | {r['p90_unloaded_ms']:.3f} | {r['p90_loaded_ms']:.3f} | "
                   f"{r['accuracy_delivered']:.2f} | {r['switches']} | {seconds(r['down_after_s'])} | "
                   f"{seconds(r['back_after_s'])} | {by_heads(r['loaded_ms'])} | {by_heads(r['after_load_ms'])} |\n"
                   for r in report["rows"])
    reasons = "".join(f"- {e['time']:.1f} s: {e['from']} -> {e['to']} heads: {e['reason']}\n"
                      for r in report["rows"] if r["loop"] for e in r["events"])
    label = f" ({report['label']})" if report.get("label") else ""
    return (f"# The latency loop under a CPU load{label}: {report['model']}, {report['target']} {report['format']} "
            f"{report['quant']}\n\nHost: {report['host']}; one engine thread; this process and a busy-looping "
            f"process pinned to one core. Budget {report['budget_ms']} ms (the largest head count's unloaded p90 "
            f"here x {report['headroom']}); {b:g} s unloaded, {l:g} s loaded, {a:g} s unloaded. The loop: window "
            f"{loop['window_s']:g} s, sustain {loop['sustain_s']:g} s, dwell {loop['dwell_s']:g} s, at most "
            f"{loop['max_switches_per_minute']} changes of the cap a minute.\n\n"
            "Candidates: " + ", ".join(f"{c['heads']} heads {c['latency_ms']:.3f} ms ({report['accuracy_basis']} "
                                       f"{c['accuracy']:.2f})" for c in report["candidates"]) + "\n\n"
            f"Accuracy delivered: the table's {report['accuracy_basis']} per head count, weighted by the time "
            "it ran. Down: the first inference below the largest head count after the load started; back: the "
            "start of the first stretch at the largest after the step down that outlasts a probe and the load, "
            "counted from the load's end (0: a probe kept as the load stopped; - : none within the run). Loaded, "
            "after the load: each head count's p50 / p90 ms once the loop's window holds only timings of that "
            "phase.\n\n"
            "| loop | inferences | over budget % | over budget while loaded % | p90 unloaded ms | p90 loaded ms | "
            "accuracy delivered | switches | down after s | back after s | loaded: heads: p50 / p90 ms | "
            "after the load: heads: p50 / p90 ms |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n" + rows
            + f"\nBack after the load, median of the loop's runs: {seconds(report['back_after_s_median'])} s.\n"
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
    p.add_argument("--preset", default="mini", help=f"mini (milliseconds an inference), b16 (the paper's model) or "
                   f"{WIDE} (the digits model at b16's widths, two blocks)")
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
    p.add_argument("--loop-window-s", type=float, default=LoopSettings.window_s)
    p.add_argument("--loop-sustain-s", type=float, default=LoopSettings.sustain_s)
    p.add_argument("--loop-dwell-s", type=float, default=LoopSettings.dwell_s)
    p.add_argument("--loop-max-switches", type=int, default=LoopSettings.max_switches_per_minute,
                   help="changes of the cap in any 60 s")
    p.add_argument("--rows", choices=("both", "on"), default="both", help="on: the loop's runs only, no run without it")
    p.add_argument("--repeat", type=int, default=1, help="runs with the loop on (the host's noise differs each run)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the results")
    p.add_argument("--name", default="closed_loop", help="the results' file name, without suffix")
    p.add_argument("--label", default="", help="what the title says of this run (e.g. the loop's rule it measures)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.repeat < 1 or not args.headroom >= 1 or \
            min(args.before_s, args.load_s, args.after_s, args.warmup_s) <= 0:
        p.error("--runs and --repeat must be >= 1, --headroom >= 1 and every phase > 0 s")
    save_report(Path(args.out), args.name, bench(args), markdown, plot)


if __name__ == "__main__":
    main()
