"""Nested vs per-subnetwork int8 weight quantisation: logit SQNR against fp32 per head count.

Nested quantisation gives every head count the largest head count's per-row weight scales, so
its int8 weights are slices of the 12-head artefact's (hydra_edge.convert.nesting); quantised on
its own, a subnetwork's truncated rows get finer scales. This puts a number on what nesting
costs: a preset model with random weights (random non-zero biases and norms too), random images,
each head count's logits with weight-only int8 fake quantisation in eager torch (per-channel
symmetric, the PT2E weight observer's scales; activations stay fp32, so this compares the two
weight schemes only), SQNR in dB against the fp32 subnetwork. Writes nested_quant.{json,md,png}.

    .venv/bin/python bench/nested_quant.py                      # b16, heads 3-12
    .venv/bin/python bench/nested_quant.py --preset digits --out /tmp/nq
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_edge.convert.nesting import both_scales, fake_quant_logits, nested_ranges
from hydra_edge.convert.naming import tool_versions
from hydra_edge.model.config import parse_heads
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.slicing import weight_index
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu

ROOT = Path(__file__).resolve().parents[1]
METHOD = ("eager torch, weight-only int8 fake quantisation (per-channel symmetric, [-127, 127], "
          "PT2E observer scales), activations fp32; not measured through a converted artefact")


def sqnr_db(out: np.ndarray, ref: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((out - ref).astype(np.float64) ** 2)))


@torch.no_grad()
def random_model(name: str, seed: int) -> HydraViT:
    """Random weights as the preset initialises them, plus biases and norms that are not 0 and 1."""
    torch.manual_seed(seed)
    model = HydraViT.from_preset(name)
    for pname, p in model.named_parameters():
        if p.dim() == 1:
            p.normal_(1.0 if "norm" in pname and pname.endswith(".weight") else 0.0, 0.05)
    return model.eval()


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model = random_model(args.preset, args.seed)
    cfg = model.config
    shape = (args.images, cfg.in_chans, cfg.img_size, cfg.img_size)
    images = np.random.default_rng(args.seed).standard_normal(shape, dtype=np.float32)
    rows = []
    for k in parse_heads(args.heads, cfg.num_heads):
        start = time.perf_counter()
        sub = model.subnetwork(k)
        with torch.no_grad():
            ref = sub(torch.from_numpy(images)).numpy()
        ranges = nested_ranges(model.named_parameters(), k, functools.partial(weight_index, cfg=cfg, k=k))
        own, nested = both_scales(sub, ranges)
        per_db = sqnr_db(fake_quant_logits(sub, own, images, args.batch), ref)
        nested_db = sqnr_db(fake_quant_logits(sub, nested, images, args.batch), ref)
        rows.append({"heads": k, "sqnr_db_per_subnetwork": round(per_db, 2), "sqnr_db_nested": round(nested_db, 2),
                     "nested_minus_per_db": round(nested_db - per_db, 2), "seconds": round(time.perf_counter() - start, 1)})
        print(f"  k={k}: per-subnetwork {per_db:.2f} dB, nested {nested_db:.2f} dB", flush=True)
    return {"preset": args.preset, "images": args.images, "seed": args.seed, "threads": args.threads,
            "method": METHOD, "host": host_cpu(), "tools": tool_versions(("torch", "torchao")), "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Nested vs per-subnetwork int8 weights: logit SQNR against fp32 ({report['preset']}, random weights)",
             "", f"Host: {report['host']}. {report['images']} random images, seed {report['seed']}.",
             f"Method: {report['method']}.", "",
             "| heads | per-subnetwork (dB) | nested (dB) | nested - per (dB) |", "|---|---|---|---|"]
    lines += [f"| {r['heads']} | {r['sqnr_db_per_subnetwork']:.2f} | {r['sqnr_db_nested']:.2f} | "
              f"{r['nested_minus_per_db']:+.2f} |" for r in report["rows"]]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    heads = [r["heads"] for r in report["rows"]]
    fig, ax = subplots(figsize=(6, 3.5))
    ax.plot(heads, [r["sqnr_db_per_subnetwork"] for r in report["rows"]], "o-", label="per-subnetwork scales")
    ax.plot(heads, [r["sqnr_db_nested"] for r in report["rows"]], "s--", label="nested (12-head) scales")
    ax.set(xlabel="heads", ylabel="logit SQNR vs fp32 (dB)", title=f"int8 weights, {report['preset']} random")
    ax.legend()
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="b16", help="b16 (the paper's model) or digits (seconds)")
    p.add_argument("--heads", default="3-12")
    p.add_argument("--images", type=int, default=8, help="random images the logits are compared on")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for nested_quant.{json,md,png}")
    args = p.parse_args(argv)
    if args.images < 1 or args.batch < 1 or args.threads < 1:
        p.error("--images, --batch and --threads must be >= 1")
    save_report(Path(args.out), "nested_quant", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
