"""Where a .tflite artefact's time goes, by LiteRT's own op profiler: ms, share and operator count per op type.

XNNPACK names each of its operators ("Fully Connected (NC, QDU8, F32, QC8W) GEMM", "Batch Matrix
Multiply (NC, QS8) GEMM"); an op left outside the delegate appears under its TFLite name. Each node's
median over ``--runs`` profiled inferences (one warm-up first), summed by op type: on a shared host
one preempted run would otherwise dominate a mean. Several artefacts (e.g. one head count before and
after an export change, or 3 and 12 heads) are profiled in turn and laid side by side. The host's CPU
and its int8 dot-product flags are named: int8 kernels run at their rate only with them. Writes
bench/results/op_profile_litert.{json,md,png}.

    .venv/bin/python bench/op_profile_litert.py runs/b16_rpi/full/vit_h3_tflite_int8-dynamic.tflite \\
        runs/b16_rpi/full/vit_h12_tflite_int8-dynamic.tflite --labels "k=3" "k=12"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hydra_edge.convert.naming import tool_versions
from hydra_edge.errors import HydraEdgeError
from hydra_edge.profiling.litert import op_table
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import cpu_family, host_cpu

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def input_shape(path: Path) -> tuple[int, ...]:
    """The shape of the artefact's (only) input, read from its flatbuffer; one line when it is no .tflite."""
    from ai_edge_litert import schema_py_generated as fb

    if not path.is_file():
        raise HydraEdgeError(f"{path}: no such file; give .tflite artefacts (a bundle written with --layout full, "
                             "or hydra-edge expand)")
    data = path.read_bytes()
    if data[4:8] != b"TFL3":
        raise HydraEdgeError(f"{path}: not a .tflite flatbuffer (no TFL3 identifier); a compact bundle's skeleton "
                             "is not one: hydra-edge expand writes the full files")
    graph = fb.Model.GetRootAs(data, 0).Subgraphs(0)
    return tuple(int(d) for d in graph.Tensors(graph.Inputs(0)).ShapeAsNumpy())


def profile(path: Path, threads: int, runs: int) -> dict[str, Any]:
    """Per op type: ms per inference, share of the profiled total, operator count (``litert.op_table``)."""
    x = np.random.default_rng(1).standard_normal(input_shape(path), dtype=np.float32)
    rows = op_table(path, x, threads, runs)
    total = sum(r["ms"] for r in rows)
    for r in rows:
        r["ms"], r["share"] = round(r["ms"], 4), round(r["ms"] / total, 4)
    return {"file": str(path), "total_ms": round(total, 4), "ops": rows}


def markdown(report: dict[str, Any]) -> str:
    """One row per op type, an (ms, share, operators) column group per artefact, in the first one's order."""
    profiles = report["profiles"]
    order = [r["op"] for p in profiles for r in p["ops"]]
    ops = list(dict.fromkeys(order))
    cells = {(p["label"], r["op"]): r for p in profiles for r in p["ops"]}
    lines = ["# LiteRT op profile\n", f"Host: {report['host']}; {report['cpu_family']}.\n",
             f"LiteRT's own profiler (XNNPACK's operators by name), {report['threads']} thread(s), batch as exported; "
             f"each operator's median over {report['runs']} profiled inferences after one warm-up, summed by op type. "
             f"ms: per inference; share: of the profiled total; n: operators of that type.\n",
             "| op | " + " | ".join(f"{p['label']} ms | share | n" for p in profiles) + " |",
             "|---" * (1 + 3 * len(profiles)) + "|"]
    for op in ops:
        row = [cells.get((p["label"], op)) for p in profiles]
        lines.append(f"| {op} | " + " | ".join(f"{r['ms']:.3f} | {r['share']:.1%} | {r['operators']}" if r else "- | - | 0"
                                               for r in row) + " |")
    lines.append("| **total** | " + " | ".join(f"**{p['total_ms']:.2f}** | 100% | {sum(r['operators'] for r in p['ops'])}"
                                               for p in profiles) + " |")
    lines += ["", *(f"- {p['label']}: `{p['file']}`" for p in profiles)]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    profiles = report["profiles"]
    ops = list(dict.fromkeys(r["op"] for p in profiles for r in p["ops"]))[:12][::-1]
    fig, ax = subplots(figsize=(9, 0.45 * len(ops) + 1.5))
    height = 0.8 / len(profiles)
    for i, p in enumerate(profiles):
        ms = {r["op"]: r["ms"] for r in p["ops"]}
        ax.barh([j + i * height for j in range(len(ops))], [ms.get(op, 0.0) for op in ops], height,
                label=f"{p['label']} ({p['total_ms']:.2f} ms)")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(ops))], ops, fontsize=7)
    ax.set(xlabel="ms per inference", title=f"LiteRT op profile, {report['threads']} thread(s)")
    ax.legend(fontsize=8)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artefacts", nargs="+", type=Path, help=".tflite files")
    p.add_argument("--labels", nargs="+", help="a column name per artefact (default: its file name)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--name", default="op_profile_litert", help="results file name (without suffix)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    labels = args.labels or [a.name for a in args.artefacts]
    if len(labels) != len(args.artefacts) or len(set(labels)) != len(labels):
        p.error(f"--labels: give {len(args.artefacts)} distinct names, one per artefact, in their order")
    try:
        for a in args.artefacts:  # every file checked before minutes of profiling
            input_shape(a)
        profiles = [{"label": label, **profile(a, args.threads, args.runs)} for label, a in zip(labels, args.artefacts)]
    except HydraEdgeError as e:  # one line, nothing written
        sys.exit(f"error: {e}")
    report = {"host": host_cpu(), "cpu_family": cpu_family(), "threads": args.threads, "runs": args.runs,
              "profiles": profiles, "tools": tool_versions()}
    save_report(Path(args.out), args.name, report, markdown, plot)


if __name__ == "__main__":
    main()
