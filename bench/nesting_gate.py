"""The nesting gate over several random initialisations: which head counts nest, and the bundle it gives.

``convert`` nests a head count's int8 weights in the largest head count's (one weight set) unless
the gate (hydra_edge.convert.nesting.measure, on hydra_edge.convert.evidence) finds that nesting
costs more than the profile's ``nest_max_cost_pp``. A checkpoint without labelled data is measured
as convert measures it: 64 random inputs (seed 0), agreement with the fp32 subnetwork. For each
random b16 initialisation (the preset's initialisation, plus non-zero biases and norms) this runs
the real gate at every head count, and once more at the smallest head count on a constructed
nesting that truly costs: the same subnetwork inside a 12-head model whose weights outside its
columns are 50x larger, so every shared row's range, and the nested scale, is far coarser.

The bundle's size is estimated from the parameters (an int8 weight 1 byte, every other tensor
4 bytes; a nested head count stores only its float tensors): the gate is the same for rpi,
android and jetson (one eager measurement, shared by every target's int8 variant), so this ratio
is each target's up to its format's overhead. Writes nesting_gate.{json,md,png}.

    .venv/bin/python bench/nesting_gate.py --cache /tmp/ng-logits  # b16, seeds 0-2, heads 3-12
    .venv/bin/python bench/nesting_gate.py --preset digits --out /tmp/ng
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_edge.convert.evidence import METHOD
from hydra_edge.convert.inputs import RANDOM_EVAL_IMAGES
from hydra_edge.convert.nesting import (MAX_COST_PP, both_scales, decide, fake_quant_logits, nested_ranges,
                                        quantised_weights)
from hydra_edge.convert.naming import tool_versions
from hydra_edge.convert.verify import EvalSet, eager_logits
from hydra_edge.model.config import parse_heads
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.slicing import weight_index
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from nested_quant import random_model  # the same random weights that bench measures SQNR on

ROOT = Path(__file__).resolve().parents[1]
COARSER = 50.0


@torch.no_grad()
def coarsened(model: HydraViT, k: int) -> HydraViT:
    """``model`` with every weight outside subnetwork ``k``'s columns ``COARSER`` times larger:
    subnetwork k is unchanged, its nested scales are not."""
    out = copy.deepcopy(model)
    for name, w in out.named_parameters():
        index = weight_index(name, model.config, k)
        if w.dim() == 2 and len(index) == 2:
            inside = w[:, index[1]].clone()
            w.mul_(COARSER)
            w[:, index[1]] = inside
    return out


def stored_bytes(sub: torch.nn.Module, nested: bool) -> int:
    """Estimated bytes a compact bundle stores for a subnetwork: int8 weights at 1 byte unless nested,
    every other tensor at 4."""
    weights = quantised_weights(sub.named_parameters())
    others = sum(p.numel() for n, p in sub.named_parameters() if n not in weights)
    return 4 * others + (0 if nested else sum(w.numel() for w in weights.values()))


def gate(model: HydraViT, k: int, evalset: EvalSet, bound: float, cache: Path | None, key: str) -> dict[str, Any]:
    """The real gate at head count ``k``; the three sets of logits it decides on are kept in ``cache``
    (``key`` names the model), so a second run re-decides in seconds."""
    sub = model.subnetwork(k)
    start = time.perf_counter()
    file = None if cache is None else cache / f"{key}-k{k}-n{len(evalset.images)}.npz"
    if file is not None and file.is_file():
        with np.load(file) as saved:
            reference, per, nested = saved["reference"], saved["per"], saved["nested"]
    else:
        reference = eager_logits(sub, evalset.images)
        ranges = nested_ranges(model.named_parameters(), k, functools.partial(weight_index, cfg=model.config, k=k))
        own_scales, nested_scales = both_scales(sub, ranges)
        per = fake_quant_logits(sub, own_scales, evalset.images)
        nested = fake_quant_logits(sub, nested_scales, evalset.images)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(file, reference=reference, per=per, nested=nested)
    n = decide(per, nested, reference, evalset.labels, bound)
    e = n.evidence
    assert e is not None
    return {"heads": k, "nested": n.nested, "cost_pp": e.cost_pp, "low_pp": e.low_pp, "high_pp": e.high_pp,
            "logit_cost_pp": e.logit_cost_pp, "decided_by": e.decided_by, "worse": e.worse, "better": e.better,
            "sqnr_db_nested": n.sqnr_db_nested, "sqnr_db_per_subnetwork": n.sqnr_db_per_subnetwork,
            "bytes": stored_bytes(sub, n.nested), "whole_bytes": stored_bytes(sub, False),
            "seconds": round(time.perf_counter() - start, 1)}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    runs = []
    for seed in args.seeds:
        model = random_model(args.preset, seed)
        cfg = model.config
        images = np.random.default_rng(0).standard_normal((args.images, cfg.in_chans, cfg.img_size, cfg.img_size),
                                                          dtype=np.float32)
        evalset = EvalSet(images, None, "random inputs")
        heads = parse_heads(args.heads, cfg.num_heads)
        rows = []
        for k in heads:
            rows.append(gate(model, k, evalset, args.bound, args.cache, f"{args.preset}-s{seed}"))
            r = rows[-1]
            print(f"seed {seed} k={k}: {'nested' if r['nested'] else 'WHOLE '} cost {r['cost_pp']:+.2f} "
                  f"[{r['low_pp']:+.2f}, {r['high_pp']:+.2f}] logits {r['logit_cost_pp']:+.3f} ({r['decided_by']}) "
                  f"{r['seconds']:.0f} s", flush=True)
        largest = max(heads)
        whole = next(r["whole_bytes"] for r in rows if r["heads"] == largest)
        ratio = (whole + sum(r["bytes"] for r in rows if r["heads"] != largest)) / whole
        costly = gate(coarsened(model, min(heads)), min(heads), evalset, args.bound, args.cache,
                      f"{args.preset}-s{seed}-coarse{COARSER:g}")
        print(f"seed {seed}: bundle {ratio:.3f}x its {largest}-head file; constructed costly nesting at "
              f"k={min(heads)}: {'nested' if costly['nested'] else 'kept whole'}", flush=True)
        runs.append({"seed": seed, "rows": rows, "bundle_ratio": round(ratio, 4), "costly": costly})
    return {"preset": args.preset, "images": args.images, "bound_pp": args.bound, "threads": args.threads,
            "coarser": COARSER, "method": METHOD, "host": host_cpu(), "tools": tool_versions(("torch", "torchao")),
            "runs": runs}


def markdown(report: dict[str, Any]) -> str:
    heads = [r["heads"] for r in report["runs"][0]["rows"]]
    lines = [f"# The nesting gate over random initialisations ({report['preset']}, {report['images']} random inputs)",
             "", f"Host: {report['host']}. Bound {report['bound_pp']} p.p. of agreement with fp32. "
             f"Method: {report['method']}.", "",
             "Each cell: nested (n) or kept whole (W), the cost the logits' error predicts (p.p.), and the cost "
             "counted on the images with its 95 % interval.", "",
             "| seed | " + " | ".join(f"k={k}" for k in heads) + " | bundle / largest file | costly nesting |",
             "|---|" + "---|" * (len(heads) + 2)]
    for run in report["runs"]:
        cells = [f"{'n' if r['nested'] else 'W'} {r['logit_cost_pp']:+.2f} ({r['cost_pp']:+.1f} "
                 f"[{r['low_pp']:+.1f}, {r['high_pp']:+.1f}])" for r in run["rows"]]
        c = run["costly"]
        lines.append(f"| {run['seed']} | " + " | ".join(cells) + f" | {run['bundle_ratio']:.3f}x | "
                     f"{'nested' if c['nested'] else 'whole'}: {c['logit_cost_pp']:+.2f} ({c['cost_pp']:+.1f} "
                     f"[{c['low_pp']:+.1f}, {c['high_pp']:+.1f}]), SQNR {c['sqnr_db_nested']} dB |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    fig, ax = subplots(figsize=(6.5, 3.5))
    for run in report["runs"]:
        heads = [r["heads"] for r in run["rows"]]
        ax.plot(heads, [r["logit_cost_pp"] for r in run["rows"]], "o-", label=f"seed {run['seed']}")
    ax.axhline(report["bound_pp"], color="grey", ls="--", label="bound")
    ax.set(xlabel="heads", ylabel="predicted cost of nesting (p.p.)",
           title=f"nesting gate, {report['preset']} random weights")
    ax.legend()
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="b16", help="b16 (the paper's model) or digits (seconds)")
    p.add_argument("--heads", default="3-12")
    p.add_argument("--seeds", default="0,1,2", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--images", type=int, default=RANDOM_EVAL_IMAGES, help="random inputs, as convert uses")
    p.add_argument("--bound", type=float, default=MAX_COST_PP, help="nest_max_cost_pp")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for nesting_gate.{json,md,png}")
    p.add_argument("--cache", type=Path, default=None,
                   help="keep the logits here (a second run re-decides from them in seconds)")
    args = p.parse_args(argv)
    if args.images < 1 or args.threads < 1 or not args.seeds:
        p.error("--images and --threads must be >= 1, --seeds not empty")
    save_report(Path(args.out), "nesting_gate", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
