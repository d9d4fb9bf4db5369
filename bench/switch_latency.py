"""Switch latency of the on-device switcher, compact against full bundles: state change -> first result.

Converts a preset model (random weights) for one target variant as a full bundle and as its
compacted copy (``hydra_edge.profiling.bundles.full_and_compact``, as bench/one_weight_set.py makes
them: the same verified artefacts, sha256 equal), times each artefact here to make a real
calibration (``hydra-edge calibrate --local`` on the full bundle; the compact bundle's table uses
the same measurements, bound to its manifest), builds a lookup table whose thermal bands pick one
candidate each (hottest: fastest), then walks the temperature of a fake sysfs tree between
neighbouring bands. Each trial times, from the moment
the new temperature can be read: ``poll()`` (reads the tree, selects) -> ``predict()`` returns
from the new head count (writing the fake file stands in for the kernel and is not timed). The next
result from the same head count is timed too: the switch's overhead is the first result's time
minus that one's (what the switch adds to an inference). Steady state before each trial (prefetch
finished, a result from the current head count); dwell skipped by a fake clock. Four rows, in one
run on one host: {full, compact} x {prefetch (the current head count and its neighbours cached), no
prefetch (cache of 1: every switch loads, and for a compact bundle rebuilds, its artefact)}.
Writes switch_latency_<preset>.{json,md,png} under ``--out``.

    .venv/bin/python bench/switch_latency.py --preset digits --heads 3,6,9,12 --trials 200
    .venv/bin/python bench/switch_latency.py --preset b16 --heads 3,6,12 --trials 40 --runs 10
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_edge.lut.make import make_lut
from hydra_edge.lut.table import points
from hydra_edge.measure.journal import read_calibration
from hydra_edge.measure.pareto import pareto
from hydra_edge.measure.session import CalibrateOptions, Session, bundle_record
from hydra_edge.model.config import parse_heads, preset
from hydra_edge.profiling.bundles import full_and_compact
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.records.calibration import Calibration
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.switcher import Switcher
from hydra_edge.transport import open_transport

ROOT = Path(__file__).resolve().parents[1]
EDGE0_C, BAND_C = 50.0, 10.0  # thermal bands <50, 50-60, 60-70, ... °C
LAYOUTS = ("full", "compact")


def calibrate_here(out: Path, runs: int, threads: int, work: Path) -> Path:
    """This machine calibrated as the device, by the calibrator itself (``hydra-edge calibrate --local``)."""
    record = work / "calibration-full.json"
    opts = CalibrateOptions(bundle=out, runs=runs, warmup=5, threads=threads, python=sys.executable, force=True)
    with open_transport(local=True, workdir=str(work / "device")) as transport:
        Session(transport, opts, record).run()
    return record


def rebound(calibration: Path, bundle: Path, work: Path) -> Path:
    """The calibration bound to ``bundle``'s manifest: its artefacts are the measured ones (same sha256)."""
    cal = read_calibration(calibration)
    cal.bundle = bundle_record(bundle, read_manifest(bundle))
    cal.write(work / "calibration-compact.json")
    return work / "calibration-compact.json"


def policy_text(bundle: Path, cal: Calibration) -> str:
    """Edges and deratings such that thermal band j picks the j-th slowest candidate, planned on what the
    table checks a budget against (the upper end of each p90's interval)."""
    front = pareto(points(read_manifest(bundle), cal)[0])[0]
    lat = [p.planned_ms for p in front]  # one band per candidate
    budget = lat[-1] * 1.001
    derating = [budget / ms * (1 - 1e-6) if j else 1.0 for j, ms in enumerate(reversed(lat))]
    derating = [max(d, 1.0) for d in derating]
    edges = [EDGE0_C + BAND_C * i for i in range(len(lat) - 1)]
    return f"budget_ms = {budget!r}\n[thermal]\nedges_c = {edges}\nderating = {derating}\n"


def band_temp(band: int) -> float:
    return EDGE0_C - BAND_C / 2 + BAND_C * band


def trials(bundle: Path, shape: tuple[int, ...], prefetch: bool, n: int, seed: int, threads: int) -> dict[str, Any]:
    """``n`` switches between neighbouring bands (the same walk for every row: one seed)."""
    board = bundle.parent / f"board-{bundle.name}"
    zone = board / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "type").write_text("cpu-thermal\n")
    temp = zone / "temp"
    temp.write_text(f"{int(band_temp(0) * 1000)}\n")
    now = [0.0]
    # raise_after_s = 0: every poll's reading counts as persisted, so a switch up is timed like a switch down
    sw = Switcher(bundle, signals={"thermal": "sysfs", "raise_after_s": 0}, root=str(board), prefetch=prefetch,
                  cache_size=3 if prefetch else 1, threads=threads, clock=lambda: now[0])
    bands = len(sw.table.thermal_edges) + 1
    x = np.zeros((1, *shape), np.float32)
    rng, band, times, polls, overheads = random.Random(seed), 0, [], [], []
    with sw:
        sw.poll()
        for _ in range(n):
            sw.wait_prefetch()
            sw.predict(x)
            band = band + rng.choice([-1, 1]) if 0 < band < bands - 1 else (1 if band == 0 else bands - 2)
            now[0] += 100.0  # past the dwell
            temp.write_text(f"{int(band_temp(band) * 1000)}\n")  # the kernel's part: not timed
            t = time.perf_counter()
            sw.poll()
            polled = time.perf_counter()
            result = sw.predict(x)
            times.append((time.perf_counter() - t) * 1e3)
            sw.wait_prefetch()  # the reference inference runs alone, as the switch's did
            again = time.perf_counter()
            sw.predict(x)  # the same head count again: an inference without the switch
            overheads.append(times[-1] - (time.perf_counter() - again) * 1e3)
            polls.append((polled - t) * 1e3)
            picked = sw.table.candidates[sw.table.cells[0][band]].heads  # the table's pick for the band
            assert result.heads == picked, (result.heads, picked, band)
    times.sort()
    overheads.sort()
    return {"prefetch": prefetch, "cache": "current + neighbours" if prefetch else "1", "trials": n,
            "p50_ms": round(percentile(times, 50), 3), "p95_ms": round(percentile(times, 95), 3),
            "max_ms": round(times[-1], 3), "poll_p50_ms": round(statistics.median(polls), 3),
            "overhead_p50_ms": round(percentile(overheads, 50), 3),
            "overhead_p95_ms": round(percentile(overheads, 95), 3)}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    heads = parse_heads(args.heads, preset(args.preset).num_heads)
    full, compact = full_and_compact(Path(args.work), args.preset, heads, args.target, args.quant, args.eval_images)
    work = full.parent
    load_before = os.getloadavg()[0]
    calibrations = {"full": calibrate_here(full, args.runs, args.threads, work)}
    calibrations["compact"] = rebound(calibrations["full"], compact, work)
    policy = work / "policy.toml"
    policy.write_text(policy_text(full, read_calibration(calibrations["full"])))
    folders = {"full": full, "compact": compact}
    docs = {layout: make_lut(folders[layout], calibrations[layout], folders[layout], policy=policy)
            for layout in LAYOUTS}
    manifest = read_manifest(compact)
    shape = (manifest.model["in_chans"], manifest.model["img_size"], manifest.model["img_size"])
    rows = []
    for layout in LAYOUTS:  # one host, one run: the rows differ only in layout and cache
        for prefetch in (True, False):
            rows.append({"layout": layout, **trials(folders[layout], shape, prefetch, args.trials, 0, args.threads)})
            print(rows[-1], flush=True)
    return {"model": f"{args.preset} preset, random weights", "target": args.target, "quant": args.quant,
            "format": manifest.artefacts[-1].format, "heads": list(heads), "host": host_cpu(),
            "threads": args.threads, "trials": args.trials,
            "compact_heads": [a.heads for a in manifest.artefacts if a.compact is not None],
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "candidates": [{"heads": c["heads"], "latency_ms": c["latency_ms"]} for c in docs["full"]["candidates"]],
            "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    rows = "".join(f"| {r['layout']} | {'prefetch' if r['prefetch'] else 'no prefetch'} | {r['cache']} | "
                   f"{r['p50_ms']:.3f} | {r['p95_ms']:.3f} | {r['max_ms']:.3f} | {r['overhead_p50_ms']:.3f} | "
                   f"{r['overhead_p95_ms']:.3f} | {r['poll_p50_ms']:.3f} |\n" for r in report["rows"])
    load = report["load_average_1min"]
    return (f"# Switch latency: {report['model']}, {report['target']} {report['format']} {report['quant']}, "
            f"heads {','.join(map(str, report['heads']))}\n\n"
            f"Host: {report['host']}; {report['threads']} engine thread(s); load average {load[0]:.1f} -> "
            f"{load[1]:.1f}. Compact bundle: heads {', '.join(map(str, report['compact_heads']))} rebuilt from "
            f"the largest artefact.\n\n"
            "New temperature readable -> poll -> first result from the new head count; "
            f"{report['trials']} switches between neighbouring candidates per row, the same walk in every row.\n\n"
            "Inference per candidate here: " + ", ".join(f"{c['heads']} heads {c['latency_ms']:.3f} ms"
                                                          for c in report["candidates"]) + "\n\n"
            "Overhead: the first result's time minus the next result's from the same head count (what the "
            "switch adds to an inference).\n\n"
            "| layout | mode | cache | p50 ms | p95 ms | max ms | overhead p50 ms | overhead p95 ms | "
            "of which poll, p50 ms |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n" + rows)


def plot(report: dict[str, Any]) -> Any:
    """p50 and p95 per row: what prefetch saves, and what a compact bundle's rebuild adds to a miss."""
    rows = report["rows"]
    labels = [f"{r['layout']}\n{'prefetch' if r['prefetch'] else 'no prefetch'}" for r in rows]
    at = np.arange(len(rows))
    fig, ax = subplots(figsize=(7, 4))
    for offset, key, label in ((-0.3, "p50_ms", "p50"), (-0.1, "p95_ms", "p95"),
                               (0.1, "overhead_p50_ms", "overhead p50"), (0.3, "overhead_p95_ms", "overhead p95")):
        ax.bar(at + offset, [r[key] for r in rows], 0.2, label=label)
    ax.set(xticks=at, xticklabels=labels, ylabel="ms", title="state change -> first result from the new head count")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{report['model']}, {report['format']} {report['quant']}; {report['host']}", fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="digits", help="digits (seconds) or b16 (the paper's model)")
    p.add_argument("--heads", default="3,6,9,12")
    p.add_argument("--target", default="jetson")
    p.add_argument("--quant", default="fp16", help="the variant to switch between")
    p.add_argument("--trials", type=int, default=200, help="switches per row")
    p.add_argument("--runs", type=int, default=50, help="timed runs per artefact for the calibration")
    p.add_argument("--threads", type=int, default=1, help="engine threads (tiny models: 1 is fastest)")
    p.add_argument("--eval-images", type=int, default=8, help="random inputs each artefact is verified on")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-switch-latency"), help="checkpoint and bundles")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for switch_latency_<preset>.*")
    args = p.parse_args(argv)
    if args.trials < 1 or args.runs < 1 or args.threads < 1:
        p.error("--trials, --runs and --threads must be >= 1")
    save_report(Path(args.out), f"switch_latency_{args.preset}", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
