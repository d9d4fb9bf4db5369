"""Does a trained backbone carry over to new classes? Fine-tuned against from-scratch, per head count.

The built-in digits are written out as two image folders: one holds some classes (the "pretraining"
classes), the other the rest. A model is trained on the first folder; then the second folder is
trained twice for the same epochs with the same recipe: once from that checkpoint (``hydra-edge train
--checkpoint``, which gives it a new classifier for the new classes and keeps the backbone), once from
new weights. Every run goes through the command a user types. Held-out top-1 per head count of each,
and whether the fine-tuned one is ahead at every k. Writes transfer.{json,md,png} under ``--out``.

    .venv/bin/python bench/transfer.py --pretrain-classes 0-4 --epochs 30 --finetune-epochs 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu

ROOT = Path(__file__).resolve().parents[1]


def write_folders(work: Path, pretrain: set[int]) -> tuple[Path, Path]:
    """The built-in digits as two class-per-folder image sets: the ``pretrain`` classes, and the others."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    first, second = work / "pretrain", work / "new-classes"
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        folder = (first if int(label) in pretrain else second) / f"digit-{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((pixels * 255 / 16).astype(np.uint8)).save(folder / f"{i:04d}.png")
    return first, second


def train(args: list[str], log: Path) -> dict[int, float]:
    """One ``hydra-edge train`` run; its held-out top-1 per head count (from the accuracy.json it writes)."""
    out = Path(args[args.index("--out") + 1])
    with log.open("a") as sink:
        done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", "train", *args], stdout=sink,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"hydra-edge train {' '.join(args)} failed; see {log}")
    rows = json.loads((out / "accuracy.json").read_text())["rows"]
    return {int(r["heads"]): float(r["top1"]) for r in rows}


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Host: {report['host']}",
        f"Pretrained on digits {s['pretrain_classes']} for {s['epochs']} epochs; then digits {s['new_classes']} "
        f"for {s['finetune_epochs']} epochs each, recipe `{s['recipe']}`, seed {s['seed']}: fine-tuned from that "
        "checkpoint (new classifier, same backbone) against new weights. Held-out top-1 %.",
        "",
        "| heads | pretrained (old classes) | from scratch | fine-tuned | fine-tuned - scratch |",
        "|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(f"| {row['heads']} | {row['pretrained']:.1f} | {row['scratch']:.1f} | {row['finetuned']:.1f} | "
                     f"{row['finetuned'] - row['scratch']:+.1f} |")
    lines += ["", f"Fine-tuned ahead at every head count: **{'yes' if report['ahead_everywhere'] else 'no'}**", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any]) -> Any:
    fig, ax = subplots(figsize=(6.4, 4))
    heads = [row["heads"] for row in report["rows"]]
    for key, label in (("finetuned", "fine-tuned from the pretrained checkpoint"), ("scratch", "from new weights")):
        ax.plot(heads, [row[key] for row in report["rows"]], marker="o", label=label)
    s = report["settings"]
    ax.set(xlabel="heads", ylabel="held-out top-1 %", xticks=heads,
           title=f"digits {s['new_classes']} after {s['finetune_epochs']} epochs")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def classes(text: str) -> set[int]:
    lo, _, hi = text.partition("-")
    return set(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrain-classes", default="0-4", help="digits the first model is trained on, e.g. 0-4")
    ap.add_argument("--epochs", type=int, default=30, help="epochs of the pretraining run")
    ap.add_argument("--finetune-epochs", type=int, default=5, help="epochs of each run on the new classes")
    ap.add_argument("--recipe", default="digits", help="recipe of both runs on the new classes (the same for both)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    pretrain = classes(ns.pretrain_classes)
    new = sorted(set(range(10)) - pretrain)
    with tempfile.TemporaryDirectory(prefix="hydra-edge-transfer-") as tmp:
        work = Path(tmp)
        log = ns.out / "transfer.log"
        ns.out.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        first, second = write_folders(work, pretrain)
        common = ["--preset", "digits", "--seed", str(ns.seed)]
        print(f"pretraining on digits {sorted(pretrain)} ({ns.epochs} epochs) ...", flush=True)
        before = train(["--data", str(first), *common, "--epochs", str(ns.epochs), "--out", str(work / "a")], log)
        tuned_args = ["--recipe", ns.recipe, "--epochs", str(ns.finetune_epochs), "--seed", str(ns.seed)]
        print(f"digits {new}: fine-tuning and from scratch ({ns.finetune_epochs} epochs each) ...", flush=True)
        tuned = train(["--data", str(second), "--checkpoint", str(work / "a" / "checkpoint.pt"), *tuned_args,
                       "--out", str(work / "b")], log)
        scratch = train(["--data", str(second), "--preset", "digits", *tuned_args, "--out", str(work / "c")], log)
    rows = [{"heads": k, "pretrained": before[k], "scratch": scratch[k], "finetuned": tuned[k]} for k in sorted(tuned)]
    report = {
        "host": host_cpu(),
        "settings": {"pretrain_classes": sorted(pretrain), "new_classes": new, "epochs": ns.epochs,
                     "finetune_epochs": ns.finetune_epochs, "recipe": ns.recipe, "seed": ns.seed},
        "rows": rows,
        "ahead_everywhere": all(r["finetuned"] > r["scratch"] for r in rows),
    }
    save_report(ns.out, "transfer", report, markdown, plot)


if __name__ == "__main__":
    main()
