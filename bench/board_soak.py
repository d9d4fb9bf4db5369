"""A long day of the real board app at high speed: does its memory stay flat once warmed up?

A board serves for weeks; what the app keeps per image (latencies, results, switch events) must be
bounded or the board runs out of memory. This converts a preset model (random weights, ONNX fp32,
3/6/12 heads; ``live_page.bench``'s bundle and profile), calibrates this machine as the device and
builds its table, then runs ``apps/board-demo/app.py`` on a scripted day of ``--steps`` steps (the demo's
day over and over: hot, cool, battery low, charging, so the head count switches all day) of
``--images-per-step`` images each, on the simulated clock: a long day at the speed of inference. Its
resident memory (``VmRSS`` from ``/proc``) and its image count (``/state.json`` of its live page) are
sampled every ``--sample-s`` seconds.

Reported: RSS after warm-up (the first ``--warmup`` fraction of the images) and at the end, and the
slope of a least-squares line through the samples after warm-up, in kB per 100,000 images. ``--app``
runs another copy of the app (e.g. an older one, to compare). Writes ``board_soak.json`` and
``board_soak.png`` (RSS against images served) under ``--out``.

    .venv/bin/python bench/board_soak.py --steps 200 --images-per-step 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from live_page import board_ready

from hydra_edge.atomic import write_bytes, write_json
from hydra_edge.commands.demo import loop_budget, scenario_steps
from hydra_edge.commands.deploy import APP
from hydra_edge.profiling.timing import host_cpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package (tests/support) is not installed: import it from there
from support.processes import free_port  # noqa: E402

Sample = Tuple[float, int, int]  # (seconds since start, images served, RSS in kB)


def rss_kb(pid: int) -> int:
    """The process's resident memory now, from /proc (kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def images_served(port: int) -> Optional[int]:
    """The app's own image count, from its live page (None between ticks or before it serves)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/state.json", timeout=5) as reply:
            state = json.loads(reply.read())["state"]
    except OSError:
        return None
    return None if state is None else int(state["images"])


def package_root(app: Path) -> Path:
    """The checkout an app.py belongs to (its hydra_edge package beside ``apps/``): an older copy runs with
    its own switcher, as it shipped."""
    root = app.resolve().parents[2]
    return root if (root / "hydra_edge").is_dir() else ROOT


def soak(app: Path, bundle: Path, images: Path, scenario: Path, budget_ms: float, work: Path,
         sample_s: float) -> Tuple[List[Sample], int]:
    """Run the app over the scenario, sampling its RSS and image count; the samples and its exit code."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(app), "--bundle", str(bundle), "--images", str(images),
                             "--scenario", str(scenario), "--sysfs-root", str(work / "soak-sysfs"), "--threads", "1",
                             "--budget-ms", str(budget_ms), "--plain", "--serve", f"127.0.0.1:{port}",
                             "--runtime-log", str(work / "soak-runtime.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(package_root(app))})
    samples: List[Sample] = []
    start = time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(sample_s)
            served = images_served(port)
            if served is not None and proc.poll() is None:
                samples.append((time.monotonic() - start, served, rss_kb(proc.pid)))
    finally:
        if proc.poll() is None:
            proc.kill()
    return samples, proc.wait()


def slope_kb_per_100k(samples: List[Sample]) -> float:
    """Least-squares growth of RSS with images served, in kB per 100,000 images."""
    xs, ys = [float(s[1]) for s in samples], [float(s[2]) for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else 1e5 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


def summary(samples: List[Sample], warmup: float) -> Dict[str, Any]:
    """RSS after warm-up and at the end, and the slope after warm-up."""
    total = samples[-1][1]
    after = [s for s in samples if s[1] >= warmup * total]
    return {"images": total, "seconds": round(samples[-1][0], 1), "rss_after_warmup_kb": after[0][2],
            "rss_end_kb": samples[-1][2], "rss_max_kb": max(s[2] for s in after),
            "growth_kb_per_100k_images": round(slope_kb_per_100k(after), 1)}


def plot(runs: Dict[str, List[Sample]], path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, samples in runs.items():
        ax.plot([s[1] / 1000 for s in samples], [s[2] / 1024 for s in samples], label=name)
    ax.set_xlabel("images served (thousands)")
    ax.set_ylabel("board app RSS (MiB)")
    ax.set_title("board app memory over a long scripted day")
    ax.legend()
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--heads", default="3,6,12")
    p.add_argument("--runs", type=int, default=20, help="timed runs per artefact for the calibration")
    p.add_argument("--steps", type=int, default=200, help="steps of the scripted day (the demo's ten, repeated)")
    p.add_argument("--images-per-step", type=int, default=2000)
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the images before RSS is judged")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--app", action="append", default=[], metavar="NAME=PATH",
                   help="another copy of app.py to soak too (e.g. before=/tmp/old_app.py); this checkout's always")
    p.add_argument("--eval-images", type=int, default=8)
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-board-soak"))
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    work = Path(args.work)
    bundle, calibration, budget, images = board_ready(work, args.preset, args.heads, args.eval_images, args.runs)
    day = scenario_steps(args.images_per_step)
    steps = [day[i % len(day)] for i in range(args.steps)]
    scenario = work / "soak-scenario.json"
    write_json(scenario, {"steps": steps})
    apps = {"this checkout": APP, **{n: Path(a) for n, _, a in (s.partition("=") for s in args.app)}}
    runs: Dict[str, List[Sample]] = {}
    report: Dict[str, Any] = {"model": f"{args.preset} preset, random weights, ONNX fp32, one thread",
                              "host": host_cpu(), "steps": args.steps, "images_per_step": args.images_per_step,
                              "warmup": args.warmup, "runs": {}}
    for name, app in apps.items():
        samples, code = soak(app, bundle, images, scenario, loop_budget(budget, calibration), work, args.sample_s)
        if code != 0 or len(samples) < 3:  # recorded, and the other apps still soak
            report["runs"][name] = {"error": f"the app exited {code} after {len(samples)} samples; "
                                             f"see {work}/soak-runtime.log"}
            print(f"{name}: {report['runs'][name]['error']}", file=sys.stderr)
            continue
        runs[name] = samples
        report["runs"][name] = {**summary(samples, args.warmup), "samples": samples}
    out = Path(args.out)
    write_json(out / "board_soak.json", report)
    plot(runs, out / "board_soak.png")
    print(f"{'app':<16} {'images':>9} {'seconds':>8} {'RSS warm (MiB)':>15} {'RSS end (MiB)':>14} "
          f"{'growth (kB/100k img)':>21}")
    for name, r in ((n, r) for n, r in report["runs"].items() if "error" not in r):
        print(f"{name:<16} {r['images']:>9} {r['seconds']:>8} {r['rss_after_warmup_kb'] / 1024:>15.1f} "
              f"{r['rss_end_kb'] / 1024:>14.1f} {r['growth_kb_per_100k_images']:>21.1f}")


if __name__ == "__main__":
    main()
