"""One weight set on the device: bytes, rebuild time, load time and inference of a compact bundle.

Converts a preset model (random weights) for each target variant (``--variants``: rpi .tflite,
android .pte, jetson .onnx by default) with ``--layout full``, then compacts a copy of that bundle
(``--layout compact``: the same verified artefacts, the largest kept whole, the others as
skeleton + recipe, the golden inputs stored once) and measures:

- bytes: every file of the compact bundle (golden pairs and manifest included) against the
  largest artefact alone and against the full bundle;
- rebuild ms per head count (p50 / p95 of ``--repeats``; the source's sha256 is checked once per
  process, as on a device, so the first rebuild is a warm-up and not counted);
- rebuild + load from memory against loading the dedicated file from disk (warm page cache), per
  head count, the two interleaved in each repeat;
- inference latency of the rebuilt artefact against the dedicated file (the same bytes), runs
  interleaved in one loop (median of ``--runs`` single-image inferences).

Engines and torch run with ``--threads`` threads. Writes one_weight_set.{json,md,png} under ``--out``.

    .venv/bin/python bench/one_weight_set.py --preset b16 --heads 3-12
    .venv/bin/python bench/one_weight_set.py --preset digits --heads 3,6,12 --variants jetson:fp16 --out /tmp/ows
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_edge.convert.naming import tool_versions
from hydra_edge.model.config import parse_heads, preset
from hydra_edge.profiling.bundles import full_and_compact
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu, paired_ms
from hydra_edge.records.manifest import LOCK, ArtefactRecord, read_manifest, stored_files
from hydra_edge.runtime.engines import load, load_bytes
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.rebuild import rebuild

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = "rpi:int8-dynamic,android:int8-dynamic,jetson:fp16"  # each target's shipped format


def bundle_bytes(folder: Path) -> int:
    """Every file a device would hold (the lock file aside)."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name != LOCK)


def stats_ms(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    return {"p50_ms": round(percentile(ms, 50), 3), "p95_ms": round(percentile(ms, 95), 3)}


def loads(compact: Path, full: Path, records: list[ArtefactRecord], threads: int, repeats: int) -> dict[int, Any]:
    """Per head count: rebuild, rebuild + load from memory, and load of the dedicated file; interleaved."""
    for r in records:  # warm-up: checks the source's sha256 once, fills the page cache
        if r.compact is not None:
            rebuild(compact, r)
        load(full / r.file, threads)
    times: dict[int, dict[str, list[float]]] = {r.heads: {"rebuild": [], "rebuilt_load": [], "dedicated_load": []}
                                                for r in records}
    for _ in range(repeats):
        for r in records:
            t0 = time.perf_counter()
            if r.compact is not None:
                data = rebuild(compact, r)
                t1 = time.perf_counter()
                load_bytes(data, r.file, threads, r.format)
                t2 = time.perf_counter()
                times[r.heads]["rebuild"].append(t1 - t0)
                times[r.heads]["rebuilt_load"].append(t2 - t0)
            t3 = time.perf_counter()
            load(full / r.file, threads, r.format)
            times[r.heads]["dedicated_load"].append(time.perf_counter() - t3)
    return {k: {name: stats_ms(v) if v else None for name, v in t.items()} for k, t in times.items()}


def inference(compact: Path, full: Path, r: ArtefactRecord, shape: tuple[int, ...], threads: int,
              runs: int) -> dict[str, Any]:
    data = rebuild(compact, r) if r.compact is not None else (compact / r.file).read_bytes()
    dedicated = (full / r.file).read_bytes()
    x = np.random.default_rng(0).standard_normal((1, *shape), dtype=np.float32)
    rebuilt_engine, file_engine = load_bytes(data, r.file, threads, r.format), load(full / r.file, threads, r.format)
    same_outputs = bool(np.array_equal(rebuilt_engine.run(x), file_engine.run(x)))
    ms = paired_ms({"rebuilt": lambda: rebuilt_engine.run(x), "dedicated": lambda: file_engine.run(x)}, runs)
    return {"same_bytes": data == dedicated, "same_outputs": same_outputs,
            "rebuilt_ms": round(ms["rebuilt"], 3), "dedicated_ms": round(ms["dedicated"], 3),
            "ratio": round(ms["rebuilt"] / ms["dedicated"], 3)}


def variant(args: argparse.Namespace, heads: tuple[int, ...], target: str, quant: str) -> dict[str, Any]:
    """Bytes, rebuild, load and inference of one target variant's compact bundle against its full one."""
    print(f"{target} {quant}:", flush=True)
    full, compact = full_and_compact(Path(args.work), args.preset, heads, target, quant, args.eval_images)
    manifest = read_manifest(compact)
    records = manifest.artefacts
    largest = max(records, key=lambda r: r.heads)
    shape = (manifest.model["in_chans"], manifest.model["img_size"], manifest.model["img_size"])
    load_ms = loads(compact, full, records, args.threads, args.repeats)
    rows = []
    for r in records:
        kept = sum((compact / name).stat().st_size for name, _, what in stored_files(compact, r)
                   if what != "recipe source")
        row = {"heads": r.heads, "artefact": r.file, "artefact_bytes": r.bytes, "compact": r.compact is not None,
               "stored_bytes": kept, **load_ms[r.heads]}
        if row["rebuilt_load"] is not None:
            row["load_ratio"] = round(row["rebuilt_load"]["p50_ms"] / row["dedicated_load"]["p50_ms"], 3)
        row["inference"] = inference(compact, full, r, shape, args.threads, args.runs)
        rows.append(row)
        print(row, flush=True)
    sizes = {"compact_bundle": bundle_bytes(compact), "full_bundle": bundle_bytes(full),
             "largest_artefact": largest.bytes,
             "golden_inputs_files": len(list(compact.glob("golden-inputs.*.npz")))}
    sizes["compact_over_largest"] = round(sizes["compact_bundle"] / largest.bytes, 3)
    sizes["full_over_largest"] = round(sizes["full_bundle"] / largest.bytes, 3)
    return {"target": target, "quant": quant, "format": largest.format, "bytes": sizes, "rows": rows}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    heads = parse_heads(args.heads, preset(args.preset).num_heads)
    variants = [variant(args, heads, *v.split(":", 1)) for v in args.variants.split(",")]
    return {"model": f"{args.preset} preset, random weights", "heads": list(heads), "host": host_cpu(),
            "threads": args.threads, "repeats": args.repeats, "runs": args.runs, "variants": variants,
            "tools": tool_versions()}


def aims(report: dict[str, Any], v: dict[str, Any]) -> list[str]:
    """The issue's goals, checked on the rows measured for one variant."""
    b, rows = v["bytes"], v["rows"]
    lines = [f"compact bundle = {b['compact_over_largest']:.3f}x the {max(report['heads'])}-head artefact "
             f"(goal <= 1.15x: {'met' if b['compact_over_largest'] <= 1.15 else 'not met'}); "
             f"full bundle = {b['full_over_largest']:.3f}x"]
    rebuilt = [r for r in rows if r["compact"]]
    if rebuilt:
        slow = max(rebuilt, key=lambda r: r["rebuild"]["p50_ms"])
        lines.append(f"slowest rebuild: {slow['heads']} heads, p50 {slow['rebuild']['p50_ms']:.1f} ms "
                     f"(goal <= 100 ms: {'met' if slow['rebuild']['p50_ms'] <= 100 else 'not met'})")
        worst = max(rebuilt, key=lambda r: r["load_ratio"])
        lines.append(f"rebuild + load from memory vs load of the file: at most {worst['load_ratio']:.2f}x "
                     f"({worst['heads']} heads; goal <= 1.2x at every k: "
                     f"{'met' if worst['load_ratio'] <= 1.2 else 'not met'})")
    same = all(r["inference"]["same_bytes"] and r["inference"]["same_outputs"] for r in rows)
    ratios = [r["inference"]["ratio"] for r in rows]
    lines.append(f"inference rebuilt / dedicated: {min(ratios):.3f}x..{max(ratios):.3f}x; "
                 f"same bytes and outputs at every k: {'yes' if same else 'NO'}")
    return lines


def _section(report: dict[str, Any], v: dict[str, Any]) -> str:
    b = v["bytes"]

    def ms(t: dict[str, float] | None) -> str:
        return "-" if t is None else f"{t['p50_ms']:.1f} / {t['p95_ms']:.1f}"

    rows = "".join(
        f"| {r['heads']} | {r['artefact_bytes'] / 2**20:.1f} | {r['stored_bytes'] / 2**20:.2f} | {ms(r['rebuild'])} | "
        f"{ms(r['rebuilt_load'])} | {ms(r['dedicated_load'])} | {r.get('load_ratio', '-')} | "
        f"{r['inference']['rebuilt_ms']:.2f} | {r['inference']['dedicated_ms']:.2f} | {r['inference']['ratio']:.3f} |\n"
        for r in v["rows"])
    notes = "\n".join(f"- {line}" for line in aims(report, v))
    return (f"## {v['target']}: {v['format']} {v['quant']}\n\n"
            f"Bytes, every file counted: compact bundle {b['compact_bundle'] / 2**20:.1f} MiB "
            f"({b['golden_inputs_files']} golden inputs file), largest artefact {b['largest_artefact'] / 2**20:.1f} "
            f"MiB, `--layout full` bundle {b['full_bundle'] / 2**20:.1f} MiB.\n\n"
            "| heads | artefact MiB | stored MiB | rebuild ms | rebuild+load ms | file load ms | load ratio | "
            "infer rebuilt ms | infer file ms | infer ratio |\n|---|---|---|---|---|---|---|---|---|---|\n"
            f"{rows}\nGoals:\n\n{notes}\n")


def markdown(report: dict[str, Any]) -> str:
    return (f"# One weight set: {report['model']}, heads {','.join(map(str, report['heads']))}\n\n"
            f"Host: {report['host']}; {report['threads']} thread(s).\n\n"
            f"ms as p50 / p95 of {report['repeats']} repeats (rebuild, rebuild + load from memory, load of the "
            f"dedicated file, interleaved); inference: median of {report['runs']} single-image runs, rebuilt and "
            "dedicated interleaved. Stored MiB: what the compact bundle keeps for that head count besides the "
            "largest artefact (skeleton + recipe).\n\n"
            + "\n".join(_section(report, v) for v in report["variants"]))


def plot(report: dict[str, Any]) -> Any:
    """Per variant: bytes each head count costs on the device, and what a rebuild adds to a load."""
    variants = report["variants"]
    fig, axes = subplots(len(variants), 2, figsize=(11, 3.6 * len(variants)), squeeze=False)
    for (left, right), v in zip(axes, variants):
        rows = v["rows"]
        heads = [r["heads"] for r in rows]
        name = f"{v['target']} {v['format']} {v['quant']}"
        left.bar([k - 0.2 for k in heads], [r["artefact_bytes"] / 2**20 for r in rows], 0.4, label="--layout full")
        left.bar([k + 0.2 for k in heads], [r["stored_bytes"] / 2**20 for r in rows], 0.4, label="--layout compact")
        left.set(title=f"{name}: stored per head count", xlabel="heads", ylabel="MiB", xticks=heads)
        left.legend(fontsize=8)
        for key, label in (("dedicated_load", "load the dedicated file"),
                           ("rebuilt_load", "rebuild + load from memory"), ("rebuild", "rebuild alone")):
            pts = [(r["heads"], r[key]["p50_ms"]) for r in rows if r.get(key)]
            if pts:
                right.plot(*zip(*pts), "-o", label=label)
        right.set(title=f"{name}: p50 ms", xlabel="heads", ylabel="ms", xticks=heads)
        right.legend(fontsize=8)
        for ax in (left, right):
            ax.grid(alpha=0.3)
    fig.suptitle(f"one weight set: {report['model']}; {report['host']}", fontsize=9)
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="b16", help="b16 (the paper's model) or digits (seconds)")
    p.add_argument("--heads", default="3-12")
    p.add_argument("--variants", default=VARIANTS, help="target:quant pairs to measure, comma-separated")
    p.add_argument("--repeats", type=int, default=10, help="rebuild and load measurements per head count")
    p.add_argument("--runs", type=int, default=20, help="inferences per head count and artefact")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-images", type=int, default=8, help="random inputs each artefact is verified on")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-one-weight-set"), help="checkpoint and bundles")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for one_weight_set.{json,md,png}")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.runs < 1 or args.threads < 1:
        p.error("--repeats, --runs and --threads must be >= 1")
    save_report(Path(args.out), "one_weight_set", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
