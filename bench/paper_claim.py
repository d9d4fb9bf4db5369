"""The paper's claim at small scale: one HydraViT against separately trained widths, on digits.

With equal budgets (the same epochs, batch and schedule per trained model):
  (a) HydraViT: one model, stochastic head sampling over heads 3..12;
  (b) separate fixed-width models of 3, 6 and 12 heads, each trained on its own;
  (c) a conventional 12-head model (always k=12) evaluated by slicing to 3, 6 and 12 heads.
Prints a table, saves bench/results/paper_claim.{json,md,png}. Not a test: it takes minutes.

    python bench/paper_claim.py --epochs 30 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hydra_edge import HydraViT
from hydra_edge.atomic import write_json, write_text
from hydra_edge.model.config import preset
from hydra_edge.model.sizes import subnet_size
from hydra_edge.train.data import load_data
from hydra_edge.train.evaluate import accuracy_per_heads
from hydra_edge.train.loop import TrainSettings, train
from hydra_edge.train.plots import plot_accuracy

RESULTS = Path(__file__).parent / "results"
REPORTED = (3, 6, 12)


def trained(heads: tuple[int, ...], settings: TrainSettings) -> HydraViT:
    torch.manual_seed(settings.seed)
    model = HydraViT(preset("digits", heads=heads))
    with tempfile.TemporaryDirectory() as out:
        train(model, load_data("digits", model.config), settings, out)
    return model


def one_seed(seed: int, epochs: int) -> dict[str, dict[int, float]]:
    settings = TrainSettings(epochs=epochs, seed=seed)
    val = load_data("digits", preset("digits")).val
    hydra = trained(tuple(range(3, 13)), settings)
    separate = {k: trained((k,), settings) for k in REPORTED}  # the 12-head one is also (c)'s conventional model
    return {
        "(a) HydraViT 3..12": accuracy_per_heads(hydra, val, range(3, 13)),
        "(b) separate models": {k: accuracy_per_heads(m, val, [k])[k] for k, m in separate.items()},
        "(c) 12-head model, sliced": accuracy_per_heads(separate[12], val, REPORTED),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    runs = [one_seed(seed, args.epochs) for seed in args.seeds]
    cfg = preset("digits")
    table = {
        name: [
            {"heads": k, "gmacs": subnet_size(cfg, k).gmacs,
             "top1": statistics.fmean(r[name][k] for r in runs),
             "std": statistics.pstdev(r[name][k] for r in runs), "runs": [r[name][k] for r in runs]}
            for k in sorted(runs[0][name])
        ]
        for name in runs[0]
    }
    seconds = time.perf_counter() - start

    lines = [f"Digits, {args.epochs} epochs per trained model, mean ± std over seeds {args.seeds} (top-1 %, held-out)", "",
             "| model | " + " | ".join(f"{k} heads" for k in REPORTED) + " |", "|---|" + "---|" * len(REPORTED)]
    for name, rows in table.items():
        by_k = {r["heads"]: r for r in rows}
        lines.append(f"| {name} | " + " | ".join(
            f"{by_k[k]['top1']:.1f} ± {by_k[k]['std']:.1f}" if k in by_k else "-" for k in REPORTED) + " |")
    hydra = {r["heads"]: r["top1"] for r in table["(a) HydraViT 3..12"]}
    lines += ["", "HydraViT, every head count: " + ", ".join(f"{k}: {v:.1f}" for k, v in hydra.items())]
    report = "\n".join(lines)
    print(report)

    write_json(RESULTS / "paper_claim.json", {"epochs": args.epochs, "seeds": args.seeds, "seconds": seconds, "table": table})
    write_text(RESULTS / "paper_claim.md", report + "\n")
    plot_accuracy(table, RESULTS / "paper_claim.png", f"digits, {args.epochs} epochs, {len(args.seeds)} seeds")
    print(f"saved {RESULTS / 'paper_claim.json'}, .md and .png ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
