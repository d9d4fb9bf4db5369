"""What a user should know before a training run spends minutes, and what its accuracy per head count means.

Each check is one line, printed before the first epoch; the run then goes on, since each is a likely
waste rather than an error. A base made for another kind of image, a run too short for its warm-up,
and a large model on a CPU (measured, not guessed) each used to cost a user a run before they found
out; so did a folder trained on b16 from new weights, which is pointed to the release's weights. A
base checkpoint gets a prediction, with its evidence from measured transfer runs, of whether the
fine-tune will beat from scratch. ``falls_with_heads`` reads a finished run's
accuracy: a HydraViT whose larger subnetworks are less accurate than smaller ones is undertrained,
and the lookup table will never choose those head counts.

Torch is imported only where a step is timed, so ``lut`` can read accuracies without it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from ..paired import difference_interval

if TYPE_CHECKING:
    from ..model.config import HydraConfig
    from ..model.hydravit import HydraViT
    from ..records.training import TrainSettings

# Where a base's best held-out top-1 on its own classes lies, as a share of the way from chance to 100 %,
# splits the runs bench/transfer.py measured into two groups (``base_prediction``).
WEAK_SHARE = 0.5
# Per group (True: under WEAK_SHARE), in how many of the runs bench/transfer.py measured (three tasks x
# seeds x a weak and a good base; a test reads them back from bench/results/transfer.json) the
# fine-tune was ahead of from scratch on the mean over head counts, and of how many.
MEASURED_AHEAD: dict[bool, tuple[int, int]] = {True: (3, 6), False: (6, 6)}
# A model whose best held-out accuracy is within this share of the way from chance to 100 % is no model
# to take to a device (``learnt_little``): convert says so where the model is first used.
NEAR_CHANCE_SHARE = 0.25
# A model heavier than this (GMACs per image at the largest head count) is timed on a CPU before it
# trains: the mini preset is 0.06, b16 17.6.
HEAVY_GMACS = 1.0
SLOW_EPOCH_S = 60.0  # an estimated CPU epoch longer than this is said, with the preset to use instead


def recorded_accuracy(saved: Mapping[str, Any], ema: bool) -> Optional[dict[int, float]]:
    """The held-out accuracy per head count a checkpoint's last epoch recorded, of the weights
    loaded (EMA or plain); None where the file keeps no history (foreign or damaged files)."""
    try:
        last = saved["train"]["history"][-1]
        accuracy = (last.get("val_top1_ema") if ema else None) or last["val_top1"]
        return {int(k): float(v) for k, v in accuracy.items()}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None


def near_chance(best: float, classes: int, share: float) -> bool:
    """Whether a best held-out top-1 % lies under ``share`` of the way from chance (on ``classes``) to 100 %:
    the one measure of how little a model learnt, for the prediction, the warning and the bench's evidence."""
    chance = 100.0 / classes
    return best < chance + share * (100.0 - chance)


def base_prediction(accuracy: Mapping[int, float], classes: int, origin: str | Path) -> str:
    """A line predicting whether fine-tuning the base will beat from scratch, with its evidence: how often
    it did in the measured runs from bases as near chance (``MEASURED_AHEAD``). A prediction, not an
    instruction: a base near chance was once said to transfer little and then led at every head count."""
    chance = 100.0 / classes
    best = max(accuracy.values())
    near = near_chance(best, classes, WEAK_SHARE)
    won, runs = MEASURED_AHEAD[near]
    verdict = "do better" if 2 * won > runs else "do worse" if 2 * won < runs else "go either way"
    return (f"note: {origin} held out {best:.1f} % at best on its own {classes} classes (chance {chance:.1f} %), "
            f"{'under' if near else 'over'} half-way to 100 %: from such bases the fine-tune beat from scratch in "
            f"{won} of {runs} measured transfer runs, so it is predicted to {verdict} (docs/training.md)")


def learnt_little(accuracy: Mapping[int, float], classes: int, origin: str | Path) -> Optional[str]:
    """A line when a model about to be taken to a device held out close to chance at every head count (its
    best within ``NEAR_CHANCE_SHARE`` of the way from chance to 100 %): every artefact, table and app built
    on it would run a model that guesses, and nothing later says so. A real model on a hard task (ImageNet
    at 25 % top-1, against 0.1 % chance) is above it; 3 epochs of the digits set (10-20 % on 10) are not."""
    chance = 100.0 / classes
    best = max(accuracy.values())
    if not near_chance(best, classes, NEAR_CHANCE_SHARE):
        return None
    return (f"warning: {origin} held out only {best:.1f} % at best on its {classes} classes (chance {chance:.1f} %): "
            "it has learnt little, and every artefact and table made from it will too; train it longer or on "
            "more images (hydra-edge train ... --resume with more --epochs) before taking it to a device")


def data_input(source: str) -> Optional[tuple[int, bool]]:
    """(shorter side in px, colour) of the images of ``source``: a built-in set's, or the first image
    of a folder's first class; None when no image can be read."""
    from .data import BUILT_IN

    if source in BUILT_IN:
        return (8 if source == "digits" else 28), False
    from PIL import Image

    exts = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
    first = next((p for p in sorted(Path(source).rglob("*")) if p.suffix.lower() in exts), None)
    if first is None:
        return None
    try:
        with Image.open(first) as image:
            colour = image.mode not in ("1", "L", "LA", "I", "I;16", "F")
            if colour and image.mode in ("RGB", "RGBA"):  # a grayscale image saved as RGB is still grayscale
                rgb = np.asarray(image.convert("RGB").resize((16, 16)), dtype=np.int16)
                colour = bool((rgb != rgb[..., :1]).any())
            return min(image.size), colour
    except OSError:
        return None


def other_input(cfg: "HydraConfig", source: str, origin: str | Path) -> Optional[str]:
    """A line when the base was made for another kind of image than ``source`` holds: grayscale for
    colour images, or less than half their size (the detail a fine-tune needs is shrunk away)."""
    from .transfer import describe_input

    found = data_input(source)
    if found is None:
        return None
    side, colour = found
    problems = []
    if colour and cfg.in_chans == 1:
        problems.append("colour is averaged away")
    if cfg.img_size * 2 <= side:
        problems.append(f"they are shrunk to {cfg.img_size} px")
    if not problems:
        return None
    kind = f"{side} px {'colour' if colour else 'grayscale'}"
    # Colour photos into a grayscale base (issue 36's digits checkpoint) lose what tells them apart; a
    # base that only shrinks images of its own kind still transferred in bench/transfer.py (28 px into 8).
    verdict = ("its backbone never saw such images: from scratch with --preset mini (64 px RGB) will likely do "
               "better" if colour and cfg.in_chans == 1 else "a base of their size would keep their detail")
    return (f"warning: {origin} takes {describe_input(cfg).removeprefix('input ')}, but {source} holds {kind} images: "
            f"{' and '.join(problems)}; {verdict}")


def short_run(settings: "TrainSettings") -> Optional[str]:
    """A line when the run ends within its warm-up: the lr never leaves the climb, the cosine never runs."""
    if settings.warmup_epochs == 0 or settings.epochs > settings.warmup_epochs:
        return None
    return (f"warning: {settings.epochs} epoch{'s' if settings.epochs > 1 else ''} of training is no longer than "
            f"the {settings.warmup_epochs} warm-up epochs of recipe {settings.recipe}: the learning rate only "
            f"climbs and never decays; give --epochs {settings.warmup_epochs + 1} or more, or --warmup-epochs 0")


# The official HydraViT weights (ImageNet-1k, 224 px, timm's layout with EMA weights), as the paper's
# code repository (github.com/ds-kiel/HydraViT) publishes them; docs/training.md says what a fine-tune costs.
RELEASE_WEIGHTS = "https://doi.org/10.5281/zenodo.14300201"


def no_pretrained(model: "HydraViT", source: str, images: int, settings: "TrainSettings") -> Optional[str]:
    """A line when a folder trains a heavy model (b16) from new weights: a ViT-B/16 needs ImageNet's
    million images to learn from nothing, so on a folder it should start from the release's weights
    (``--checkpoint``), or the folder should train ``--preset mini`` from scratch. A run with the
    ``finetune`` recipe starts from pretrained heads (``--init``) and is left alone."""
    from ..model.sizes import subnet_size
    from .data import BUILT_IN

    cfg = model.config
    if source in BUILT_IN or settings.recipe == "finetune" or subnet_size(cfg, max(cfg.heads)).gmacs < HEAVY_GMACS:
        return None
    return (f"note: {cfg.img_size} px model from new weights on {images} images: a ViT this size learns little "
            f"from a folder; fine-tune the official HydraViT weights ({RELEASE_WEIGHTS}) with --checkpoint, or "
            "train --preset mini from scratch (docs/training.md, 'Without a pretrained checkpoint')")


def step_seconds(model: "HydraViT", batch: int, steps: int = 2) -> float:
    """Seconds one training step of ``batch`` images takes on this CPU, averaged over the head counts
    the run samples: ``steps`` timed forward and backward passes of 2 images at the middle head count,
    after one untimed, scaled to the batch (a step's work is linear in its images)."""
    import torch
    from torch.nn import functional as F

    cfg = model.config
    k = sorted(cfg.heads)[len(cfg.heads) // 2]
    x = torch.randn(2, cfg.in_chans, cfg.img_size, cfg.img_size)
    y = torch.zeros(2, dtype=torch.long)
    was = model.training
    model.train()
    try:
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            F.cross_entropy(model(x, heads=k), y).backward()
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    finally:
        model.train(was)
    return sum(times[1:]) / steps * batch / 2


def cpu_epoch(model: "HydraViT", batch: int, images: int, preset_name: Optional[str],
              seconds: Optional[float] = None) -> Optional[str]:
    """A line when an epoch of ``images`` on this CPU is estimated to take over ``SLOW_EPOCH_S``;
    ``seconds`` per step when already measured, else measured here. With a preset that can be swapped
    (``preset_name``; None for a checkpoint's model), names the one to use instead."""
    from ..model.config import preset
    from ..model.sizes import subnet_size

    cfg = model.config
    gmacs = subnet_size(cfg, max(cfg.heads)).gmacs
    if gmacs < HEAVY_GMACS:
        return None
    per_step = step_seconds(model, batch) if seconds is None else seconds
    epoch = per_step * max(1, images // batch)
    if epoch <= SLOW_EPOCH_S:
        return None
    mini = subnet_size(preset("mini", num_classes=cfg.num_classes), 12).gmacs
    instead = (f"--preset mini (64 px) does about {gmacs / mini:.0f}x less work per image"
               if preset_name != "mini" else "a GPU")
    what = f"--preset {preset_name}" if preset_name else "this checkpoint's model"
    return (f"warning: {what} ({cfg.img_size} px) on a CPU: about {_duration(epoch)} an epoch of {images} images "
            f"here ({per_step:.1f} s a step of {batch}, measured); {instead}")


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 \
        else f"{seconds:.0f} s"


def falls_with_heads(right: Mapping[int, np.ndarray]) -> list[tuple[int, float, int, float]]:
    """(k, its accuracy, the fewer-heads k' most accurate, its accuracy) for every head count that gets
    fewer held-out images right than a smaller one, judged as convert's gates judge a drop: on the same
    images, a fall only where the 95 % interval of the difference lies wholly above 0. ``right``: per head
    count, whether it got each held-out image right. On a trained HydraViT accuracy rises with heads, so a
    fall means the larger subnetworks are undertrained (too few epochs or images); on 40 images one
    image's difference (2.5 p.p.) is no evidence of one."""
    accuracy = {k: 100.0 * int(r.sum()) / max(len(r), 1) for k, r in right.items()}
    falls, best_k = [], None
    for k in sorted(right):
        if best_k is not None and accuracy[k] < accuracy[best_k]:
            better, worse = right[best_k], right[k]
            both, first = int(np.sum(better & worse)), int(np.sum(better & ~worse))
            second = int(np.sum(~better & worse))
            low, _ = difference_interval(both, first, second, len(better) - both - first - second)
            if low > 0:
                falls.append((k, accuracy[k], best_k, accuracy[best_k]))
        if best_k is None or accuracy[k] > accuracy[best_k]:
            best_k = k
    return falls


def falls_line(right: Mapping[int, np.ndarray]) -> Optional[str]:
    """The training summary's one line when accuracy falls with heads, naming the worst fall."""
    falls = falls_with_heads(right)
    if not falls:
        return None
    k, acc, best_k, best = max(falls, key=lambda f: (f[3] - f[1], f[0]))
    images = len(next(iter(right.values())))
    return (f"warning: accuracy falls with heads ({_heads(f[0] for f in falls)} below a smaller head count beyond "
            f"the 95 % interval on the same {images} held-out images; worst {k} heads: {acc:.1f} % < {best:.1f} % "
            f"at {best_k}): the larger subnetworks are undertrained; train longer or with more data, or the "
            "lookup table will never choose them")


def _heads(ks: Any) -> str:
    ks = list(ks)
    return f"{ks[0]} heads" if len(ks) == 1 else f"{', '.join(map(str, ks[:-1]))} and {ks[-1]} heads"


def before_training(*, settings: "TrainSettings", model: "HydraViT", source: str, images: int,
                    base: Optional[tuple[str | Path, Optional[Mapping[int, float]], int]],
                    preset_name: Optional[str], cpu: bool) -> list[str]:
    """Every line a run should start with. ``base`` is (path, its recorded accuracy or None, its
    class count) for a ``--checkpoint``, None for new weights; ``images`` the training images of an epoch."""
    lines = []
    if base is not None:
        origin, accuracy, classes = base
        if accuracy:
            lines.append(base_prediction(accuracy, classes, origin))
        lines.append(other_input(model.config, source, origin))
    else:
        lines.append(no_pretrained(model, source, images, settings))
    lines.append(short_run(settings))
    if cpu:
        lines.append(cpu_epoch(model, settings.batch_size * settings.accum_steps, images,
                               None if base is not None else preset_name))
    return [line for line in lines if line]
