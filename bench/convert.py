"""Benchmark of ``hydra-edge convert`` on the paper's model (b16 preset, random weights).

For each target and head count: conversion seconds and bytes (from the bundle's manifest, made by
the real pipeline), and host latency of the artefact in its own engine and of eager fp32 torch,
measured in the same run (median of ``--runs`` after warm-up, 1 and 2 threads), with the ratio.
Writes bench/results/convert.{json,md,png}. A failing row is recorded, the rest still runs.

    .venv/bin/python bench/convert.py --heads 3,12 --targets rpi,android,jetson
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import save_report, subplots  # noqa: E402
from hydra_edge.config import parse_heads  # noqa: E402
from hydra_edge.convert.manifest import read_manifest  # noqa: E402
from hydra_edge.convert.pipeline import ConvertOptions, convert, tool_versions  # noqa: E402
from hydra_edge.model import HydraViT  # noqa: E402
from hydra_edge.runtime.engines import load  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def paired_ms(fns: dict[str, Callable[[], Any]], runs: int, warmup: int = 3) -> dict[str, float]:
    """Median ms of each function, runs interleaved so that both see the same load on a shared host."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def host_cpu() -> str:
    """CPU model and its int8 dot-product extensions: int8 speed-ups hinge on VNNI (x86) or dotprod (arm)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith(("flags", "Features"))), []))
    found = sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"})
    return f"{model}, {os.cpu_count()} cores visible, int8-relevant flags: {', '.join(found) or 'none'}"


def bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "b16_random.pt"
    torch.manual_seed(0)
    model = HydraViT.from_preset("b16")
    if not ckpt.is_file():
        model.save(ckpt)  # random weights, no data spec: verification is agreement-only
    else:
        from hydra_edge.checkpoint import load_checkpoint

        model = load_checkpoint(ckpt)
    heads = parse_heads(args.heads, 12)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    threads = (1, 2)
    subnets, xt = {k: model.subnetwork(k) for k in heads}, torch.from_numpy(x)
    eager: dict[tuple[int, int], list[float]] = {}  # every eager measurement, per (heads, threads)
    rows: list[dict[str, Any]] = []
    for target in args.targets.split(","):
        out = work / target
        start = time.perf_counter()
        try:
            result = convert(ConvertOptions(checkpoint=ckpt, target=target, out=out, heads=args.heads,
                                            eval_limit=args.eval_images, layout="full"),  # times each file
                             lambda f, s, n: print(f"  {target}: {f}: {s}", flush=True))
            failed = result.failed
        except Exception as e:  # the table still gets a row for this target
            failed = [f"{type(e).__name__}: {e}"]
        print(f"{target}: converted in {time.perf_counter() - start:.0f} s; failures: {failed}", flush=True)
        manifest = read_manifest(out) if (out / "manifest.json").is_file() else None
        for a in manifest.artefacts if manifest else []:
            if a.heads not in heads:
                continue
            row: dict[str, Any] = {
                "target": target, "heads": a.heads, "artefact": a.file, "format": a.format, "quant": a.quant,
                "bytes": a.bytes, "convert_s": a.convert_seconds, "gmacs": a.gmacs,
                "agreement_pct": a.accuracy["agreement"], "status": "ok",
            }
            try:
                for t in threads:
                    engine = load(out / a.file, threads=t)
                    torch.set_num_threads(t)
                    with torch.no_grad():
                        ms = paired_ms({"artefact": lambda: engine.run(x), "eager": lambda: subnets[a.heads](xt)},
                                       args.runs)
                    eager.setdefault((a.heads, t), []).append(ms["eager"])
                    row[f"ms_{t}t"] = round(ms["artefact"], 2)
                    row[f"eager_ms_{t}t"] = round(ms["eager"], 2)
                    row[f"speedup_{t}t"] = round(ms["eager"] / ms["artefact"], 2)
            except Exception as e:
                row["status"] = f"latency failed: {type(e).__name__}: {e}"
                traceback.print_exc()
            rows.append(row)
            print(row, flush=True)
        for f in failed:
            rows.append({"target": target, "status": f"failed: {f}"})
    return {
        "model": "b16 preset (ViT-B/16, 224 px, 1000 classes), random weights", "host": host_cpu(),
        "runs": args.runs, "threads": list(threads), "heads": list(heads),
        "eager_ms": {f"h{k}_{t}t": round(statistics.median(v), 2) for (k, t), v in eager.items()},
        "tools": tool_versions(), "rows": rows,
    }


def aims(report: dict[str, Any]) -> list[str]:
    """The issue's two aims, checked per artefact kind on the rows present."""
    lines = []
    ok = [r for r in report["rows"] if r.get("status") == "ok"]
    for key in sorted({(r["target"], r["format"], r["quant"]) for r in ok}):
        by_k = {r["heads"]: r for r in ok if (r["target"], r["format"], r["quant"]) == key}
        name = f"{key[0]} {key[1]} {key[2]}"
        if 12 in by_k and "int8" in key[2]:
            s = max(by_k[12]["speedup_1t"], by_k[12]["speedup_2t"])
            lines.append(f"{name}: 12 heads {s:.2f}x faster than eager fp32 (aim >= 4x: {'met' if s >= 4 else 'not met'})")
        if 3 in by_k and 12 in by_k:
            r = min(by_k[3][f"ms_{t}t"] / by_k[12][f"ms_{t}t"] for t in (1, 2))
            lines.append(f"{name}: latency at 3 heads = {r:.3f}x latency at 12 (aim <= 0.15x: {'met' if r <= 0.15 else 'not met'})")
    return lines


def _md_row(r: dict[str, Any]) -> str:
    def cell(key: str, spec: str = "") -> str:
        return "" if r.get(key) is None else format(r[key], spec)

    mib = f"{r['bytes'] / 2**20:.1f}" if "bytes" in r else ""
    cells = [r["target"], cell("heads"), cell("artefact"), mib, cell("convert_s", ".1f"), cell("agreement_pct", ".1f"),
             *(cell(f"{m}_{t}t", spec) for t in (1, 2) for m, spec in (("ms", ".1f"), ("eager_ms", ".1f"), ("speedup", ".2f"))),
             r["status"]]
    return "| " + " | ".join(cells) + " |\n"


def markdown(report: dict[str, Any]) -> str:
    head = ("| target | heads | artefact | MiB | convert s | agree % | ms 1t | eager 1t | x 1t | ms 2t | eager 2t | x 2t | status |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = aims(report)
    if not any(flag in report["host"] for flag in ("vnni", "amx_int8", "asimddp", "i8mm")):
        lines.append("This host CPU has no int8 dot-product instructions (VNNI / dotprod), so int8 GEMMs run at about "
                     "fp32 speed here: the 4x aim for int8 is not decidable on this host; measure it on the device.")
    notes = "\n".join(f"- {line}" for line in lines)
    return (f"# hydra-edge convert benchmark\n\n{report['model']}; batch 1; median of {report['runs']} runs after "
            f"3 warm-up runs, artefact and eager fp32 runs interleaved; x = eager ms / artefact ms.\n\n"
            f"Host: {report['host']} (shared with other jobs).\n\n"
            f"{head}{''.join(_md_row(r) for r in report['rows'])}\n## Aims\n\n{notes}\n")


def plot(report: dict[str, Any]) -> Any:
    fig, axes = subplots(1, 2, figsize=(11, 4.2), sharey=True)
    ok = [r for r in report["rows"] if r.get("status") == "ok"]
    for ax, t in zip(axes, (1, 2)):
        heads = report["heads"]
        eager = sorted((int(key[1:].split("_")[0]), v) for key, v in report["eager_ms"].items() if key.endswith(f"_{t}t"))
        if eager:
            ax.plot(*zip(*eager), "k--o", label="eager torch fp32 (median over rows)")
        for key in sorted({(r["target"], r["format"], r["quant"]) for r in ok}):
            pts = sorted((r["heads"], r[f"ms_{t}t"]) for r in ok if (r["target"], r["format"], r["quant"]) == key)
            ax.plot(*zip(*pts), "-o", label=" ".join(key))
        ax.set(title=f"{t} thread{'s' if t > 1 else ''}", xlabel="heads", yscale="log", xticks=heads)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("host latency, ms (batch 1)")
    axes[1].legend(fontsize=8)
    fig.suptitle("b16 subnetworks: artefact latency against heads")
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="3,12")
    p.add_argument("--targets", default="rpi,android,jetson")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--eval-images", type=int, default=8, help="random inputs each artefact is verified on")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-convert"), help="checkpoint and bundles (reused)")
    args = p.parse_args()
    save_report(RESULTS, "convert", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
