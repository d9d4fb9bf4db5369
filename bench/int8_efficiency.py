"""How close each int8 artefact comes to its own runtime's int8 limit on this host.

The limit: the int8 MAC rate each runtime reaches on one large fully-connected layer, (197 x 3072)
times (3072 x 3072) by default, exported by the project's own exporters with the artefacts' recipe
(LiteRT and ExecuTorch: PT2E dynamic-range int8 per channel; onnxruntime: static QDQ on MatMul/Gemm
with the jetson profile's options). An artefact's efficiency = its subnetwork's MACs / its latency /
that rate (the FC layer is exported only for the kinds of artefact given). FC layers, artefacts (from
``--bundles``, converted beforehand) and eager fp32 torch of
the same subnetworks are timed in the same run, single inferences interleaved (each once the one
before has left no thread spinning), medians, at each
batch size and thread count; each runtime's own profiler breaks the smallest and largest head
count down by op type. Writes bench/results/int8_efficiency.{json,md,png}.

    .venv/bin/python bench/int8_efficiency.py --bundles runs/b16_rpi/full runs/b16_android/full
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hydra_edge.convert.naming import tool_versions
from hydra_edge.errors import HydraEdgeError
from hydra_edge.formats import FORMATS
from hydra_edge.model.checkpoint import load_checkpoint
from hydra_edge.model.config import HydraConfig
from hydra_edge.model.sizes import subnet_size
from hydra_edge.profiling.arguments import FC_SHAPE, fc_shape, positive_list
from hydra_edge.profiling.recipes import RECIPES, Stacked, export_with_recipe
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import cpu_family, host_cpu, paired_ms
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.engines import load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# format -> the module whose ``op_times`` is that runtime's own per-op profiler
PROFILERS = {"tflite": "hydra_edge.profiling.litert", "executorch": "hydra_edge.profiling.executorch",
             "onnx": "hydra_edge.profiling.onnxruntime"}


def fc_artefacts(tokens: int, width_in: int, width_out: int, work: Path, kinds: set[tuple[str, str]]
                 ) -> tuple[dict[str, Path], torch.nn.Module, np.ndarray]:
    """One ``Linear(width_in, width_out)`` fed (1, tokens, width_in), exported with each recipe of ``kinds``
    (format, quant: the artefacts given); with the module and an input.

    An FC layer over ``batch x tokens`` rows is the batch's FC layer: the batch-8 rate is this with 8x the tokens.
    """
    torch.manual_seed(0)
    fc = torch.nn.Linear(width_in, width_out).eval()
    x = np.random.default_rng(0).standard_normal((1, tokens, width_in), dtype=np.float32)
    paths = {f"{fmt} {quant}": export_with_recipe(fc, x, fmt, quant, target, (tokens, width_in),
                                                  work / f"fc{tokens}_{fmt}_{quant}{FORMATS[fmt].suffix}",
                                                  f"FC {tokens}x{width_in}x{width_out}")
             for fmt, quant, target in RECIPES if (fmt, quant) in kinds}
    return paths, fc, x


def top_ops(per_op: dict[str, float], top: int = 10) -> list[dict[str, Any]]:
    """The ``top`` op types by time, with their share of all profiled time."""
    total = sum(per_op.values())
    return [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)}
            for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]]


def _programs(rows: list[dict[str, Any]], models: dict[str, Any], batch: int, work: Path
              ) -> list[tuple[dict[str, Any], Path, torch.nn.Module, np.ndarray]]:
    """(row, artefact, eager subnetwork, input) per timed artefact at ``batch``.

    Batch 1: every artefact of the bundles as converted. A larger batch: each bundle's smallest and
    largest head count, exported again for that batch with the same recipe (``Stacked``).
    """
    out = []
    for r in rows:
        cfg = models[r["checkpoint"]].config
        sub = models[r["checkpoint"]].subnetwork(r["heads"]).eval()
        x = np.random.default_rng(1).standard_normal((1, batch * cfg.in_chans, cfg.img_size, cfg.img_size), dtype=np.float32)
        if batch == 1:
            out.append((r, Path(r["bundle"]) / r["file"], sub, x))
            continue
        if r["heads"] in _ends(rows, r["bundle"]):
            path = work / f"b{batch}_{len(out)}_{r['file']}"
            export_with_recipe(Stacked(sub, batch), x, r["format"], r["quant"], r["target"], x.shape[1:], path,
                               f"{r['target']} {r['heads']} heads, batch {batch}")
            out.append((r, path, Stacked(sub, batch).eval(), x))
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tokens, width_in, width_out = (int(n) for n in args.fc.split("x"))
    bundles = []
    for folder in args.bundles:
        manifest = read_manifest(folder)
        cfg = HydraConfig.from_dict(manifest.model, f"{folder}/manifest.json: $.model")
        bundles.append((Path(folder), manifest, cfg))
    models = {}  # one eager model per checkpoint: its subnetworks are the fp32 references
    for _, manifest, _ in bundles:
        ckpt = manifest.checkpoint
        if ckpt["path"] not in models:
            models[ckpt["path"]] = load_checkpoint(ckpt["path"], ema=ckpt.get("weights") != "state_dict")
    rows = [{"bundle": str(folder), "target": m.target["name"], "heads": a.heads, "format": a.format,
             "quant": a.quant, "file": a.file, "gmacs": size.gmacs, "gmacs_run": size.exported_macs / 1e9,
             "checkpoint": m.checkpoint["path"]}
            for folder, m, cfg in bundles for a in m.artefacts if (a.format, a.quant) in {r[:2] for r in RECIPES}
            for size in [subnet_size(cfg, a.heads)]]
    timed: dict[tuple[int, int], dict[str, float]] = {}  # (batch, threads) -> median ms per program
    measured: dict[int, list[dict[str, Any]]] = {}  # batch -> rows timed at that batch
    refused: list[str] = []  # programs a runtime would not run (a bundle's rows are then left out at that batch)
    with tempfile.TemporaryDirectory(prefix="hydra-fc-") as tmp:
        for batch in args.batch:
            fc_paths, fc, fc_x = fc_artefacts(tokens * batch, width_in, width_out, Path(tmp),
                                              {(r["format"], r["quant"]) for r in rows})
            programs = _programs(rows, models, batch, Path(tmp))
            measured[batch] = [r for r, *_ in programs]
            for t in args.threads:
                torch.set_num_threads(t)
                fc_t = torch.from_numpy(fc_x)
                fns: dict[str, Callable[[], Any]] = {"fc torch fp32": lambda: fc(fc_t)}
                for name, path in fc_paths.items():
                    fns[f"fc {name}"] = (lambda e: lambda: e.run(fc_x))(load(path, threads=t))
                for r, path, eager, x in programs:
                    if r["bundle"] not in {o["bundle"] for o in measured[batch]}:
                        continue  # its runtime refused one of this bundle's programs at this batch
                    key = f"{r['bundle']} {r['heads']}"
                    engine = load(path, threads=t)
                    try:
                        engine.run(x)
                    except RuntimeError as e:  # a runtime that cannot run this batch: recorded, the rest runs
                        refused.append(f"{r['target']} {r['file']}, batch {batch}: {str(e).splitlines()[-1]}")
                        measured[batch] = [o for o in measured[batch] if o["bundle"] != r["bundle"]]
                        continue
                    fns[f"artefact {key}"] = (lambda e, x: lambda: e.run(x))(engine, x)
                    fns[f"eager {key}"] = (lambda m, x: lambda: m(x))(eager, torch.from_numpy(x))
                print(f"batch {batch}, {t} thread(s): timing {len(fns)} programs, {args.runs} interleaved runs", flush=True)
                with torch.no_grad():
                    timed[batch, t] = paired_ms(fns, args.runs)
    report = _report(args, tokens * width_in * width_out, measured, timed)
    report["not_measured"] += [f"{m} (refused by its runtime)" for m in refused]
    report["profiles"] = profiles(rows, models, args.runs)
    return report


def _ends(rows: list[dict[str, Any]], bundle: str) -> set[int]:
    """The smallest and largest head count of ``bundle``'s rows."""
    heads = [o["heads"] for o in rows if o["bundle"] == bundle]
    return {min(heads), max(heads)}


def profiles(rows: list[dict[str, Any]], models: dict[str, Any], runs: int) -> dict[str, list[dict[str, Any]]]:
    """Each runtime's own op profile of each bundle's smallest and largest head count, batch 1, 1 thread."""
    out = {}
    for r in rows:
        if r["heads"] not in _ends(rows, r["bundle"]):
            continue
        op_times = import_module(PROFILERS[r["format"]]).op_times
        cfg = models[r["checkpoint"]].config
        x = np.random.default_rng(1).standard_normal((1, cfg.in_chans, cfg.img_size, cfg.img_size), dtype=np.float32)
        out[f"{r['target']} {r['file']}"] = top_ops(op_times(Path(r["bundle"]) / r["file"], x, 1, runs))
    return out


def _report(args: argparse.Namespace, fc_macs: int, measured: dict[int, list[dict[str, Any]]],
            timed: dict[tuple[int, int], dict[str, float]]) -> dict[str, Any]:
    """Rates, efficiencies and ratios from the medians (ms) of every timed program, per batch and thread count."""
    rates = [{"runtime": name, "batch": b, "threads": t, "ms": round(ms[f"fc {name}"], 4),
              "gmac_per_s": round(b * fc_macs / (ms[f"fc {name}"] / 1e3) / 1e9, 3)}
             for (b, t), ms in timed.items()
             for name in ["torch fp32", *(f"{f} {q}" for f, q, _ in RECIPES if f"fc {f} {q}" in ms)]]
    rate = {(r["runtime"], r["batch"], r["threads"]): r["gmac_per_s"] for r in rates}
    artefacts = []
    for (b, t), ms in timed.items():
        rows = measured[b]
        for r in rows:
            latency = ms[f"artefact {r['bundle']} {r['heads']}"]
            eager = ms[f"eager {r['bundle']} {r['heads']}"]
            largest = max((o for o in rows if o["bundle"] == r["bundle"]), key=lambda o: o["heads"])
            gmacs = b * r["gmacs"]
            limit = rate[f"{r['format']} {r['quant']}", b, t]
            artefacts.append({
                **{k: r[k] for k in ("bundle", "target", "heads", "format", "quant", "file")},
                "batch": b, "threads": t, "gmacs": round(gmacs, 6), "ms": round(latency, 4),
                "gmac_per_s": round(gmacs / (latency / 1e3), 3),
                "efficiency": round(gmacs / (latency / 1e3) / limit, 3),
                # the same on the MACs the artefact computes (its last block works for the cls token alone)
                "efficiency_on_macs_run": round(b * r["gmacs_run"] / (latency / 1e3) / limit, 3),
                "eager_fp32_ms": round(eager, 4), "eager_over_artefact": round(eager / latency, 2),
                "over_largest_latency": round(latency / ms[f"artefact {r['bundle']} {largest['heads']}"], 3),
                "over_largest_macs": round(r["gmacs"] / largest["gmacs"], 3),
                "largest_heads": largest["heads"],
            })
    kinds = {(a["format"], a["quant"]) for a in artefacts}
    missing = [f"{f} {q} ({target})" for f, q, target in RECIPES if (f, q) not in kinds]
    return {
        "host": host_cpu(), "cpu_family": cpu_family(), "fc": {"shape": args.fc, "macs": fc_macs}, "runs": args.runs,
        "threads": args.threads, "batches": args.batch, "fc_rates": rates, "artefacts": artefacts,
        "not_measured": [f"{m}: no bundle of these artefacts was given (--bundles)" for m in missing],
        "tools": tool_versions(),
    }


def summary(report: dict[str, Any]) -> list[str]:
    """The issue's table: per artefact kind, batch and thread count, FC rate, efficiency per head count,
    smallest / largest latency."""
    heads = sorted({a["heads"] for a in report["artefacts"]})
    rate = {(r["runtime"], r["batch"], r["threads"]): r["gmac_per_s"] for r in report["fc_rates"]}
    lines = ["| target: format quant | batch | threads | FC rate GMAC/s | " + " | ".join(f"k={k}" for k in heads)
             + " | k_min / k_max latency | k_min / k_max MACs |", "|---" * (len(heads) + 6) + "|"]
    fields = ("target", "format", "quant", "batch", "threads")
    for key in sorted({tuple(a[f] for f in fields) for a in report["artefacts"]}):
        by_k = {a["heads"]: a for a in report["artefacts"] if tuple(a[f] for f in fields) == key}
        low = by_k[min(by_k)]
        cells = [f"{by_k[k]['efficiency']:.2f}" if k in by_k else "" for k in heads]
        lines.append(f"| {key[0]}: {key[1]} {key[2]} | {key[3]} | {key[4]} | {rate[f'{key[1]} {key[2]}', key[3], key[4]]:.1f} | "
                     + " | ".join(cells) + f" | {low['over_largest_latency']:.3f} | {low['over_largest_macs']:.3f} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    fc = report["fc"]["shape"]
    lines = ["# int8 efficiency: each artefact against its runtime's FC rate\n",
             f"Host: {report['host']}; {report['cpu_family']}.\n",
             f"FC rate: one fully-connected layer {fc} (tokens x in x out; batch b: b x tokens) exported with each "
             f"artefact kind's recipe. Medians of {report['runs']} single inferences after 3 warm-up runs, every FC layer, "
             f"artefact and eager fp32 subnetwork of a batch size interleaved in the same run, each inference started once the "
             f"previous one's threads had stopped spinning. Efficiency = subnetwork "
             f"MACs x batch / latency / FC rate at that batch; cells are efficiencies per head count. An artefact computes "
             f"fewer MACs than its subnetwork (its last block works for the cls token alone, the only token the logits "
             f"read): the per-artefact table also gives its efficiency on the MACs it runs. Batch 1: the "
             f"bundles' artefacts; larger batches: each bundle's smallest and largest head count exported again for "
             f"that batch with the same recipe. eager/artefact is reported, not a goal: it depends on the CPU's int8 "
             f"instructions.\n",
             *summary(report), "", "| runtime | batch | threads | FC ms | FC GMAC/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['runtime']} | {r['batch']} | {r['threads']} | {r['ms']:.2f} | {r['gmac_per_s']:.1f} |"
              for r in report["fc_rates"]]
    lines += ["", "| target | format | quant | batch | threads | heads | GMAC | ms | GMAC/s | efficiency | "
              "on MACs run | latency / largest | MACs / largest | eager fp32 ms | eager / artefact |", "|---" * 15 + "|"]
    lines += [f"| {a['target']} | {a['format']} | {a['quant']} | {a['batch']} | {a['threads']} | {a['heads']} | "
              f"{a['gmacs']:.3f} | {a['ms']:.2f} | {a['gmac_per_s']:.1f} | {a['efficiency']:.2f} | "
              f"{a['efficiency_on_macs_run']:.2f} | "
              f"{a['over_largest_latency']:.3f} | {a['over_largest_macs']:.3f} | {a['eager_fp32_ms']:.1f} | "
              f"{a['eager_over_artefact']:.2f} |" for a in report["artefacts"]]
    for name, ops in report["profiles"].items():
        lines += ["", f"Op profile of {name} by its runtime's own profiler, batch 1, 1 thread (ms per inference, summed "
                  f"by op type):", "", "| op | ms | share |", "|---|---|---|",
                  *(f"| {o['op']} | {o['ms']:.2f} | {o['share']:.2f} |" for o in ops)]
    above = sorted({(a["format"], a["quant"], a["batch"], a["threads"]) for a in report["artefacts"] if a["efficiency"] > 1})
    lines += ["", *(f"- {f} {q}, batch {b}, {t} thread(s): an artefact beats the FC rate: at this shape, batch and "
                    f"thread count the FC layer falls short of the runtime's int8 limit (too small a layer, or threads "
                    f"it uses less well than the model), so these efficiencies are overstated." for f, q, b, t in above)]
    lines += [f"- Not measured: {m}" for m in report["not_measured"]]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    panels = sorted({(a["batch"], a["threads"]) for a in report["artefacts"]})
    fig, axes = subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), sharey=True, squeeze=False)
    for ax, (b, t) in zip(axes[0], panels):
        for key in sorted({(a["target"], a["format"], a["quant"]) for a in report["artefacts"]}):
            pts = sorted((a["heads"], a["efficiency"]) for a in report["artefacts"]
                         if (a["target"], a["format"], a["quant"]) == key and (a["batch"], a["threads"]) == (b, t))
            if pts:
                ax.plot(*zip(*pts), "-o", label=" ".join(key))
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set(title=f"batch {b}, {t} thread{'s' if t > 1 else ''}", xlabel="heads",
               xticks=sorted({a["heads"] for a in report["artefacts"]}),
               ylim=(0, max([1.05, *(1.1 * a["efficiency"] for a in report["artefacts"])])))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("efficiency (MAC rate / runtime's FC rate)")
    fig.suptitle(f"int8 artefacts against their runtime's FC rate ({report['fc']['shape']})")
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", nargs="+", required=True, help="converted bundle folders (with manifest.json)")
    p.add_argument("--fc", default=FC_SHAPE, type=fc_shape, help="FC layer tokens x in x out")
    p.add_argument("--threads", default="1,2", type=positive_list, help="thread counts, e.g. 1,2")
    p.add_argument("--batch", default="1,8", type=positive_list, help="batch sizes, e.g. 1,8")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    try:
        report = bench(args)
    except HydraEdgeError as e:  # a bundle that is missing or damaged: one line, nothing written
        sys.exit(f"error: {e}")
    save_report(Path(args.out), "int8_efficiency", report, markdown, plot)


if __name__ == "__main__":
    main()
