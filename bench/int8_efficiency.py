"""How close each int8 artefact comes to its own runtime's int8 limit on this host.

The limit: the int8 MAC rate each runtime reaches on one large fully-connected layer, (197 x 3072)
times (3072 x 3072) by default, exported by the project's own exporters with the artefacts' recipe
(LiteRT and ExecuTorch: PT2E dynamic-range int8 per channel; onnxruntime: static QDQ on MatMul/Gemm
with the jetson profile's options). An artefact's efficiency = its subnetwork's MACs / its latency /
that rate. FC layers, artefacts (from ``--bundles``, converted beforehand) and eager fp32 torch of
the same subnetworks are timed in the same run, single inferences interleaved, medians, batch 1.
Writes bench/results/int8_efficiency.{json,md,png}.

    .venv/bin/python bench/int8_efficiency.py --bundles runs/b16_rpi/full runs/b16_android/full
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.convert import host_cpu, paired_ms  # noqa: E402
from bench.op_profile_onnxruntime import op_times as ort_op_times  # noqa: E402
from bench.report import save_report, subplots  # noqa: E402
from hydra_edge.checkpoint import load_checkpoint  # noqa: E402
from hydra_edge.config import HydraConfig  # noqa: E402
from hydra_edge.convert.manifest import read_manifest  # noqa: E402
from hydra_edge.convert.pipeline import tool_versions  # noqa: E402
from hydra_edge.convert.targets import load_target  # noqa: E402
from hydra_edge.errors import HydraEdgeError  # noqa: E402
from hydra_edge.runtime.engines import FORMATS, load  # noqa: E402
from hydra_edge.sizes import subnet_size  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# (format, quant, target whose profile gives the exporter options): the artefacts' recipes
RECIPES = (("tflite", "int8-dynamic", "rpi"), ("executorch", "int8-dynamic", "android"), ("onnx", "int8-qdq", "jetson"))


def _options(fmt: str, quant: str, target: str) -> dict[str, Any]:
    """The exporter options the target profile gives this format and quantisation."""
    return next(dict(v.options) for v in load_target(target).artefacts if (v.format, v.quant) == (fmt, quant))


def cpu_family() -> str:
    """Vendor, family and model numbers from /proc/cpuinfo: "AMD EPYC" alone does not say which generation."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        return "unknown"
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def fc_artefacts(tokens: int, width_in: int, width_out: int, work: Path) -> tuple[dict[str, Path], torch.nn.Module, np.ndarray]:
    """One ``Linear(width_in, width_out)`` fed (1, tokens, width_in), exported per recipe; with the module and an input."""
    torch.manual_seed(0)
    fc = torch.nn.Linear(width_in, width_out).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, tokens, width_in), dtype=np.float32)
    paths = {}
    for fmt, quant, target in RECIPES:
        options = _options(fmt, quant, target)
        calibration = rng.standard_normal((int(options.get("calibration_images", 1)), tokens, width_in), dtype=np.float32)
        path = work / f"fc_{fmt}_{quant}{FORMATS[fmt].suffix}"
        exporter = __import__(FORMATS[fmt].exporter, fromlist=["export"])
        print(f"FC {tokens}x{width_in}x{width_out}: {fmt} {quant}", flush=True)
        with torch.no_grad():
            exporter.export(fc, torch.from_numpy(x), quant, options, calibration, path,
                            lambda s, f=fmt: print(f"  {f}: {s}", flush=True))
        paths[f"{fmt} {quant}"] = path
    return paths, fc, x


def top_ops(per_op: dict[str, float], top: int = 10) -> list[dict[str, Any]]:
    """The ``top`` op types by time, with their share of all profiled time."""
    total = sum(per_op.values())
    return [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)}
            for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]]


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tokens, width_in, width_out = (int(n) for n in args.fc.split("x"))
    fc_macs = tokens * width_in * width_out
    bundles = []
    for folder in args.bundles:
        manifest = read_manifest(folder)
        cfg = HydraConfig.from_dict(manifest.model, f"{folder}/manifest.json: $.model")
        bundles.append((Path(folder), manifest, cfg))
    with tempfile.TemporaryDirectory(prefix="hydra-fc-") as tmp:
        fc_paths, fc, fc_x = fc_artefacts(tokens, width_in, width_out, Path(tmp))
        models = {}  # one eager model per checkpoint: its subnetworks are the fp32 references
        for _, manifest, _ in bundles:
            ckpt = manifest.checkpoint
            if ckpt["path"] not in models:
                models[ckpt["path"]] = load_checkpoint(ckpt["path"], ema=ckpt.get("weights") != "state_dict")
        rows = [{"bundle": str(folder), "target": m.target["name"], "heads": a.heads, "format": a.format,
                 "quant": a.quant, "file": a.file, "gmacs": subnet_size(cfg, a.heads).gmacs, "checkpoint": m.checkpoint["path"]}
                for folder, m, cfg in bundles for a in m.artefacts if (a.format, a.quant) in {r[:2] for r in RECIPES}]
        subnets = {(r["checkpoint"], r["heads"]): models[r["checkpoint"]].subnetwork(r["heads"]).eval() for r in rows}
        rng = np.random.default_rng(1)
        images = {m.checkpoint["path"]: rng.standard_normal((1, cfg.in_chans, cfg.img_size, cfg.img_size), dtype=np.float32)
                  for _, m, cfg in bundles}
        by_thread = {}
        for t in args.threads:
            torch.set_num_threads(t)
            fns: dict[str, Callable[[], Any]] = {}
            fc_t = torch.from_numpy(fc_x)
            fns["fc torch fp32"] = lambda: fc(fc_t)
            for name, path in fc_paths.items():
                fns[f"fc {name}"] = (lambda e: lambda: e.run(fc_x))(load(path, threads=t))
            for r in rows:
                engine = load(Path(r["bundle"]) / r["file"], threads=t)
                fns[f"artefact {r['bundle']} {r['heads']}"] = (lambda e, x: lambda: e.run(x))(engine, images[r["checkpoint"]])
            for ckpt, k in subnets:
                x = torch.from_numpy(images[ckpt])
                fns[f"eager {ckpt} {k}"] = (lambda m, x: lambda: m(x))(subnets[ckpt, k], x)
            print(f"{t} thread(s): timing {len(fns)} programs, {args.runs} interleaved runs", flush=True)
            with torch.no_grad():
                by_thread[t] = paired_ms(fns, args.runs)
        report = _report(args, fc_macs, rows, by_thread)
    ends = [r for r in rows if r["format"] == "onnx" and r["heads"] in
            {f(o["heads"] for o in rows if o["bundle"] == r["bundle"]) for f in (min, max)}]
    report["profiles"] = {f"{r['target']} {r['file']}": top_ops(ort_op_times(Path(r["bundle"]) / r["file"],
                                                                                 images[r["checkpoint"]], 1, args.runs)) for r in ends}
    return report


def _report(args: argparse.Namespace, fc_macs: int, rows: list[dict[str, Any]],
            by_thread: dict[int, dict[str, float]]) -> dict[str, Any]:
    """Rates, efficiencies and ratios from the medians (ms) of every timed program, per thread count."""
    rates = [{"runtime": name, "threads": t, "ms": round(ms[f"fc {name}"], 4),
              "gmac_per_s": round(fc_macs / (ms[f"fc {name}"] / 1e3) / 1e9, 3)}
             for t, ms in by_thread.items() for name in ["torch fp32", *(f"{f} {q}" for f, q, _ in RECIPES)]]
    rate = {(r["runtime"], r["threads"]): r["gmac_per_s"] for r in rates}
    artefacts = []
    for r in rows:
        for t, ms in by_thread.items():
            latency = ms[f"artefact {r['bundle']} {r['heads']}"]
            eager = ms[f"eager {r['checkpoint']} {r['heads']}"]
            largest = max((o for o in rows if o["bundle"] == r["bundle"]), key=lambda o: o["heads"])
            runtime_rate = rate[f"{r['format']} {r['quant']}", t]
            artefacts.append({
                **{k: r[k] for k in ("bundle", "target", "heads", "format", "quant", "file")},
                "threads": t, "gmacs": round(r["gmacs"], 6), "ms": round(latency, 4),
                "gmac_per_s": round(r["gmacs"] / (latency / 1e3), 3),
                "efficiency": round(r["gmacs"] / (latency / 1e3) / runtime_rate, 3),
                "eager_fp32_ms": round(eager, 4), "eager_over_artefact": round(eager / latency, 2),
                "over_largest_latency": round(latency / ms[f"artefact {r['bundle']} {largest['heads']}"], 3),
                "over_largest_macs": round(r["gmacs"] / largest["gmacs"], 3),
                "largest_heads": largest["heads"],
            })
    measured = {(a["format"], a["quant"]) for a in artefacts}
    missing = [f"{f} {q} ({target})" for f, q, target in RECIPES if (f, q) not in measured]
    return {
        "host": host_cpu(), "cpu_family": cpu_family(), "fc": {"shape": args.fc, "macs": fc_macs}, "runs": args.runs, "threads": args.threads,
        "batch": 1, "fc_rates": rates, "artefacts": artefacts,
        "not_measured": [f"{m}: no bundle of these artefacts was given (--bundles)" for m in missing],
        "tools": tool_versions(),
    }


def summary(report: dict[str, Any]) -> list[str]:
    """The issue's table: per artefact kind and thread count, FC rate, efficiency per head count, smallest / largest latency."""
    heads = sorted({a["heads"] for a in report["artefacts"]})
    rate = {(r["runtime"], r["threads"]): r["gmac_per_s"] for r in report["fc_rates"]}
    lines = ["| target: format quant | threads | FC rate GMAC/s | " + " | ".join(f"k={k} efficiency" for k in heads)
             + " | k_min / k_max latency | k_min / k_max MACs |", "|---" * (len(heads) + 5) + "|"]
    for key in sorted({(a["target"], a["format"], a["quant"], a["threads"]) for a in report["artefacts"]}):
        by_k = {a["heads"]: a for a in report["artefacts"] if (a["target"], a["format"], a["quant"], a["threads"]) == key}
        low = by_k[min(by_k)]
        cells = [f"{by_k[k]['efficiency']:.2f}" if k in by_k else "" for k in heads]
        lines.append(f"| {key[0]}: {key[1]} {key[2]} | {key[3]} | {rate[f'{key[1]} {key[2]}', key[3]]:.1f} | "
                     + " | ".join(cells) + f" | {low['over_largest_latency']:.3f} | {low['over_largest_macs']:.3f} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    fc = report["fc"]["shape"]
    lines = [f"# int8 efficiency: each artefact against its runtime's FC rate\n",
             f"Host: {report['host']}; {report['cpu_family']}.\n",
             f"FC rate: one fully-connected layer {fc} (tokens x in x out) exported with each artefact kind's recipe; "
             f"batch 1; medians of {report['runs']} single inferences after 3 warm-up runs, every FC layer, artefact and "
             f"eager fp32 subnetwork interleaved in the same run. Efficiency = subnetwork MACs / latency / FC rate. "
             f"eager/artefact is reported, not a goal: it depends on the CPU's int8 instructions.\n",
             *summary(report), "", "| runtime | threads | FC ms | FC GMAC/s |", "|---|---|---|---|"]
    lines += [f"| {r['runtime']} | {r['threads']} | {r['ms']:.2f} | {r['gmac_per_s']:.1f} |" for r in report["fc_rates"]]
    lines += ["", "| target | format | quant | threads | heads | GMAC | ms | GMAC/s | efficiency | latency / largest | "
              "MACs / largest | eager fp32 ms | eager / artefact |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {a['target']} | {a['format']} | {a['quant']} | {a['threads']} | {a['heads']} | {a['gmacs']:.3f} | "
              f"{a['ms']:.2f} | {a['gmac_per_s']:.1f} | {a['efficiency']:.2f} | {a['over_largest_latency']:.3f} | "
              f"{a['over_largest_macs']:.3f} | {a['eager_fp32_ms']:.1f} | {a['eager_over_artefact']:.2f} |"
              for a in report["artefacts"]]
    for name, ops in report["profiles"].items():
        lines += ["", f"onnxruntime profile of {name}, 1 thread (mean per inference, by op type):", "",
                  "| op | ms | share |", "|---|---|---|", *(f"| {o['op']} | {o['ms']:.2f} | {o['share']:.2f} |" for o in ops)]
    above = sorted({(a["format"], a["quant"], a["threads"]) for a in report["artefacts"] if a["efficiency"] > 1})
    lines += ["", *(f"- {f} {q}, {t} threads: an artefact beats the FC rate: the FC layer does not use these "
                    f"threads as well as the model does, so its rate understates the runtime's limit here and the "
                    f"efficiencies are overstated; compare at 1 thread." for f, q, t in above)]
    lines += [*(f"- Not measured: {m}" for m in report["not_measured"]),
              "- Batch 8 not measured: the artefacts are exported for batch 1."]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    threads = report["threads"]
    fig, axes = subplots(1, len(threads), figsize=(5.5 * len(threads), 4.2), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], threads):
        for key in sorted({(a["target"], a["format"], a["quant"]) for a in report["artefacts"]}):
            pts = sorted((a["heads"], a["efficiency"]) for a in report["artefacts"]
                         if (a["target"], a["format"], a["quant"]) == key and a["threads"] == t)
            ax.plot(*zip(*pts), "-o", label=" ".join(key))
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set(title=f"{t} thread{'s' if t > 1 else ''}", xlabel="heads", xticks=sorted({a["heads"] for a in report["artefacts"]}),
               ylim=(0, max([1.05, *(1.1 * a["efficiency"] for a in report["artefacts"])])))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("efficiency (MAC rate / runtime's FC rate)")
    fig.suptitle(f"int8 artefacts against their runtime's FC rate ({report['fc']['shape']})")
    return fig


def _fc_shape(text: str) -> str:
    """``TOKENSxINxOUT``, three positive integers (checked, so a typo fails before minutes of export)."""
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not TOKENSxINxOUT, e.g. 197x3072x3072")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", nargs="+", required=True, help="converted bundle folders (with manifest.json)")
    p.add_argument("--fc", default="197x3072x3072", type=_fc_shape, help="FC layer tokens x in x out")
    p.add_argument("--threads", default="1", type=lambda s: [int(t) for t in s.split(",")], help="e.g. 1,2")
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
