"""Switch latency of the on-device switcher: state change -> first result from the new subnetwork.

Converts the digits preset (random weights) for the target, times each artefact here to make a
real calibration, builds a lookup table whose thermal bands pick one candidate each (hottest:
fastest), then walks the temperature of a fake sysfs tree between neighbouring bands. Each trial
times, from the moment the new temperature can be read: ``poll()`` (reads the tree, selects) ->
``predict()`` returns from the new head count (writing the fake file stands in for the kernel and
is not timed: on this machine's disk it alone takes ~1 ms). Steady state before each trial (prefetch finished, a result from the
current head count); dwell skipped by a fake clock. Two modes: prefetch (cache of 3: current and
neighbours) and no prefetch (cache of 1: every switch loads its artefact).
Writes bench/results/switch_latency.{json,md}.

    .venv/bin/python bench/switch_latency.py --target rpi --heads 3,6,9,12 --trials 200
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra_edge.atomic import write_json, write_text  # noqa: E402
from hydra_edge.calibrate.record import Calibration  # noqa: E402
from hydra_edge.calibrate.session import CalibrateOptions, Session  # noqa: E402
from hydra_edge.config import parse_heads, preset  # noqa: E402
from hydra_edge.convert.manifest import read_manifest  # noqa: E402
from hydra_edge.convert.pipeline import ConvertOptions, convert  # noqa: E402
from hydra_edge.lut.command import make_lut  # noqa: E402
from hydra_edge.lut.table import Point, pareto  # noqa: E402
from hydra_edge.model import HydraViT  # noqa: E402
from hydra_edge.runtime.signals import percentile  # noqa: E402
from hydra_edge.runtime.switcher import Switcher  # noqa: E402
from hydra_edge.transport import open_transport  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EDGE0_C, BAND_C = 50.0, 10.0  # thermal bands <50, 50-60, 60-70, ... °C


def bundle(work: Path, target: str, heads: str) -> Path:
    ckpt = work / "digits_random.pt"
    if not ckpt.is_file():
        torch.manual_seed(0)
        cfg = preset("digits")
        HydraViT(preset("digits", heads=parse_heads(heads, cfg.num_heads))).save(ckpt)
    out = work / f"bundle_{target}"
    convert(ConvertOptions(checkpoint=ckpt, target=target, out=out, heads=heads))  # incremental
    return out


def calibrate_here(out: Path, runs: int, threads: int, work: Path) -> Calibration:
    """This machine calibrated as the device, by the calibrator itself (``hydra-edge calibrate --local``)."""
    opts = CalibrateOptions(bundle=out, runs=runs, warmup=5, threads=threads, python=sys.executable, force=True)
    with open_transport(local=True, workdir=str(work / "device")) as transport:
        return Session(transport, opts, work / "calibration.json").run()


def _input_shape(model: dict[str, Any]) -> tuple[int, int, int]:
    return (model["in_chans"], model["img_size"], model["img_size"])


def policy_text(cal: Calibration) -> str:
    """Edges and deratings such that thermal band j picks the j-th slowest candidate."""
    front = pareto([Point(r.heads, r.artefact, r.latency_ms, r.heads, None) for r in cal.measured()])[0]
    lat = [p.latency_ms for p in front]  # one band per candidate
    budget = lat[-1] * 1.001
    derating = [budget / ms * (1 - 1e-6) if j else 1.0 for j, ms in enumerate(reversed(lat))]
    derating = [max(d, 1.0) for d in derating]
    edges = [EDGE0_C + BAND_C * i for i in range(len(lat) - 1)]
    return f"budget_ms = {budget!r}\n[thermal]\nedges_c = {edges}\nderating = {derating}\n"


def band_temp(band: int) -> float:
    return EDGE0_C - BAND_C / 2 + BAND_C * band


def trials(out: Path, shape: tuple[int, int, int], prefetch: bool, n: int, seed: int, threads: int) -> dict[str, Any]:
    board = out.parent / "board"
    zone = board / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "type").write_text("cpu-thermal\n")
    temp = zone / "temp"
    temp.write_text(f"{int(band_temp(0) * 1000)}\n")
    now = [0.0]
    # raise_after_s = 0: every poll's reading counts as persisted, so a switch up is timed like a switch down
    sw = Switcher(out, signals={"thermal": "sysfs", "raise_after_s": 0}, root=str(board), prefetch=prefetch,
                  cache_size=3 if prefetch else 1, threads=threads, clock=lambda: now[0])
    bands = len(sw.table.thermal_edges) + 1
    x = np.zeros((1, *shape), np.float32)
    rng, band, times, polls = random.Random(seed), 0, [], []
    sw.poll()
    with sw:
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
            polls.append((polled - t) * 1e3)
            assert result.heads == sw.table.candidates[bands - 1 - band].heads, (result.heads, band)
    times.sort()
    return {"prefetch": prefetch, "cache_size": sw.cache_size, "trials": n, "p50_ms": percentile(times, 50),
            "p95_ms": percentile(times, 95), "max_ms": times[-1], "poll_p50_ms": statistics.median(polls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="rpi")
    ap.add_argument("--heads", default="3,6,9,12")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--runs", type=int, default=50, help="timed runs per artefact for the calibration")
    ap.add_argument("--threads", type=int, default=1, help="engine threads (tiny models: 1 is fastest)")
    ap.add_argument("--work", default="/tmp/hydra-edge-bench-switch")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = bundle(work, args.target, args.heads)
    load_before = os.getloadavg()[0]
    cal = calibrate_here(out, args.runs, args.threads, work)
    (work / "policy.toml").write_text(policy_text(cal))
    doc = make_lut(out, work / "calibration.json", out, policy=work / "policy.toml")
    shape = _input_shape(read_manifest(out).model)
    rows = [trials(out, shape, prefetch, args.trials, 0, args.threads) for prefetch in (True, False)]
    report = {"target": args.target, "model": "digits preset, random weights", "machine": platform.machine(),
              "cpus": os.cpu_count(), "threads": args.threads,
              "load_average_1min": [load_before, os.getloadavg()[0]],
              "candidates": [{"heads": c["heads"], "latency_ms": c["latency_ms"]} for c in doc["candidates"]],
              "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "switch_latency.json", report)
    lines = [f"# Switch latency ({args.target}, {report['model']}, {report['cpus']} CPUs, {args.threads} engine "
             f"thread(s), load average {load_before:.1f} -> {os.getloadavg()[0]:.1f})", "",
             "New temperature readable -> poll -> first result from the new head count; "
             f"{args.trials} switches between neighbouring candidates each.", "",
             "Inference per candidate here: " + ", ".join(f"{c['heads']} heads {c['latency_ms']:.3f} ms"
                                                           for c in report["candidates"]), "",
             "| mode | cache | p50 ms | p95 ms | max ms | of which poll, p50 ms |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {'prefetch' if r['prefetch'] else 'no prefetch'} | {r['cache_size']} | {r['p50_ms']:.3f} | "
              f"{r['p95_ms']:.3f} | {r['max_ms']:.3f} | {r['poll_p50_ms']:.3f} |" for r in rows]
    write_text(RESULTS / "switch_latency.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
