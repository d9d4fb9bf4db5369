"""Training recipes as data, and the parts a recipe asks for, built from torch's own pieces.

A recipe is a set of ``TrainSettings`` values under a name (timm's habit: the recipe is one namespace
of settings that a short loop reads). ``settings_for`` starts from a recipe and lets every value the
user typed win. The parts: AdamW over parameter groups (layer-wise lr decay, no weight decay on
biases and norms), linear warm-up then cosine per optimizer step (``LambdaLR``), an EMA copy of the
weights (``AveragedModel`` with ``get_ema_multi_avg_fn``) and the autocast precision. Why each
recipe holds what it holds: docs/training.md.
"""

from __future__ import annotations

import itertools
import math
import platform
from typing import Any

import msgspec
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..errors import HydraEdgeError
from ..records.training import TrainSettings

# The values each recipe sets; everything it leaves out keeps ``TrainSettings``' default, which is the
# "digits" recipe (what every run trained with before recipes existed).
RECIPES: dict[str, dict[str, Any]] = {
    # 8x8 grayscale digits: a crop of 8 px leaves little of a digit (crops and erasing cost 19 p.p.),
    # a mirrored 2 is no 2, and RandAugment's photo operations erase strokes one pixel wide. What runs
    # trained with before recipes existed, kept so (docs/training.md has what the other parts do here).
    "digits": {},
    # A small folder of your own classes, from a pretrained checkpoint. Chosen by measurement
    # (bench/transfer.py; docs/training.md has the figures): the new classifier must move within a few
    # epochs, so the peak is the digits recipe's 3e-3 for 32 images (scaled linearly with the batch),
    # one warm-up epoch, every layer at that rate (layer decay 0.75 trailed by 5-11 p.p. at every head
    # count), clipping for a new classifier's first gradients. No augmentation, mixup, drop path or
    # EMA: with them and 1e-3 per 512 images (the previous recipe) the loss stayed at chance for 5 epochs.
    "finetune": dict(
        epochs=10, batch_size=32, lr=3e-3, lr_batch=32, min_lr=1e-5, weight_decay=0.05, warmup_epochs=1,
        decay_all=False, clip_grad=1.0, label_smoothing=0.1,
    ),
    # A small folder from new weights, no pretrained checkpoint (``--preset mini``). Chosen by measurement
    # (bench/from_scratch.py; docs/training.md has the figures): a ViT from new weights sits at chance
    # until its attention learns where to look, which takes optimizer steps, and a few thousand images
    # at batch 32 are 125 steps an epoch. Batch 8 gives four times the steps for the same images and
    # about the same time; lr 1e-3 as given (not scaled with the batch), one warm-up epoch (none
    # trailed), clipping for the first steps' large gradients, no augmentation (none to remove: the
    # digits recipe has none either).
    "scratch": dict(
        epochs=10, batch_size=8, lr=1e-3, lr_batch=0, min_lr=1e-5, weight_decay=0.05, warmup_epochs=1,
        decay_all=False, clip_grad=1.0, label_smoothing=0.1,
    ),
    # The official release's (DeiT's recipe, as the HydraViT paper trains ImageNet-1k).
    "imagenet": dict(
        epochs=300, batch_size=256, lr=5e-4, lr_batch=512, min_lr=1e-5, weight_decay=0.05, warmup_epochs=5,
        decay_all=False, drop_path=0.1, ema_decay=0.99996, label_smoothing=0.1, mixup=0.8, cutmix=1.0,
        rand_augment=9, random_erasing=0.25, crop_scale=0.08, flip=True,
    ),
}
EMA_WARMUP = 10  # the EMA keeps min(decay, (1 + t) / (EMA_WARMUP + t)) at its t-th update


def settings_for(recipe: str, **typed: Any) -> TrainSettings:
    """The settings of ``recipe`` with every value the user typed in its place (typed values win)."""
    if recipe not in RECIPES:
        raise HydraEdgeError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    return msgspec.structs.replace(TrainSettings(), recipe=recipe, **{**RECIPES[recipe], **typed})


def default_recipe(data: str, preset_name: str | None, pretrained: bool) -> str:
    """The recipe a run without ``--recipe`` trains with: ``finetune`` for a folder and a pretrained
    model (``--checkpoint``, ``--init``; built-in data keeps ``digits`` there, as before); for new
    weights, ``digits`` on the digits preset (the demo and every digits figure were trained so) and
    ``scratch`` on any other, where the digits recipe learnt little in a few epochs (bench/from_scratch.py).

    ``preset_name`` is None where the command picks the preset: digits for built-in data, else b16.
    """
    from .data import BUILT_IN

    if pretrained:
        return "digits" if data in BUILT_IN else "finetune"
    return "digits" if (preset_name or ("digits" if data in BUILT_IN else "b16")) == "digits" else "scratch"


def peak_lr(settings: TrainSettings) -> float:
    """The schedule's peak: ``lr`` as given, or scaled linearly from ``lr_batch`` images to the images
    one optimizer step sees (micro-batch x accumulation, all ranks), as DeiT scales 5e-4 per 512."""
    if not settings.lr_batch:
        return settings.lr
    return settings.lr * settings.batch_size * settings.accum_steps / settings.lr_batch


def layer_of(name: str, depth: int) -> int:
    """Which layer a parameter belongs to for layer-wise lr decay: the embedding 0, block i i + 1,
    the final norm and every classifier depth + 1 (BEiT's and timm's numbering)."""
    if name.startswith(("patch_embed.", "cls_token", "pos_embed")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(model: nn.Module, settings: TrainSettings, lr: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups: one per (lr scale, decayed or not), each layer's ``lr_scale`` being
    ``layer_decay ** (depth + 1 - layer)``.

    ``decay_all=False`` keeps weight decay off biases, norms, the cls token and the position
    embedding (timm's ``param_groups_weight_decay``): decay pulls them to zero, which is no prior
    for any of them. With neither that nor layer decay the model is one group, as before recipes,
    so a checkpoint saved then still resumes into the optimizer it was saved from.
    """
    if settings.layer_decay == 1.0 and settings.decay_all:
        return [{"params": list(model.parameters()), "lr": lr, "weight_decay": settings.weight_decay}]
    depth = model.config.depth
    groups: dict[tuple[float, bool], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        decayed = settings.decay_all or not (param.ndim <= 1 or name in ("cls_token", "pos_embed"))
        scale = settings.layer_decay ** (depth + 1 - layer_of(name, depth))
        group = groups.setdefault((scale, decayed), {
            "params": [], "lr": lr * scale, "lr_scale": scale,
            "weight_decay": settings.weight_decay if decayed else 0.0,
        })
        group["params"].append(param)
    return list(groups.values())


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.0) -> float:
    """Linear warm-up then cosine decay to ``floor`` of the peak (DeiT's schedule, per optimizer step)."""
    if step < warmup:
        return (step + 1) / warmup
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def optimizer_and_schedule(model: nn.Module, settings: TrainSettings,
                           steps_per_epoch: int) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over ``param_groups`` and its per-step schedule; every group follows the same curve
    from its own peak (``LambdaLR`` scales each group's initial lr)."""
    lr = peak_lr(settings)
    optimizer = torch.optim.AdamW(param_groups(model, settings, lr), lr=lr, weight_decay=settings.weight_decay)
    warmup, total = settings.warmup_epochs * steps_per_epoch, settings.epochs * steps_per_epoch
    floor = min(1.0, settings.min_lr / lr)
    return optimizer, LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total, floor))


def ema_copy(model: nn.Module, decay: float, updates: int = 0) -> AveragedModel:
    """An exponential moving average of ``model``'s weights, updated by ``ema.update_parameters(model)``
    after each optimizer step; ``ema.module`` has the model's own keys (saved as ``state_dict_ema``).

    The decay warms up as ``min(decay, (1 + t) / (10 + t))`` at the t-th update (TensorFlow's and
    timm's warm-up), so the EMA of a 300-step fine-tune is not mostly its starting weights;
    ``updates`` continues the count of a resumed run.
    """
    counter = itertools.count(max(updates, 1))  # AveragedModel copies at its first update, then averages

    def average(ema_params: Any, params: Any, n_averaged: Any) -> None:
        t = next(counter)
        get_ema_multi_avg_fn(min(decay, (1 + t) / (EMA_WARMUP + t)))(ema_params, params, n_averaged)

    ema = AveragedModel(model, multi_avg_fn=average, use_buffers=True)
    ema.n_averaged.fill_(updates)
    return ema


def cpu_has_bf16() -> bool:
    """This CPU computes bf16 natively (AVX512-BF16 or AMX on x86, as oneDNN reports it on Arm); elsewhere
    bf16 is emulated, slower than fp32."""
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """What ``--precision`` runs as on ``device``: an autocast dtype, or None for fp32.

    ``auto``: bf16 on a CUDA GPU that has it (fp16 with loss scaling on one that does not), fp32 on
    a CPU. A precision the device cannot run is one line, before anything trains.
    """
    cuda = device.type == "cuda"
    if precision == "auto":
        return None if not cuda else torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "fp32":
        return None
    if precision == "fp16":
        if not cuda:
            raise HydraEdgeError("--precision fp16 needs a CUDA GPU (a CPU has no fast fp16 training); "
                                 "use --precision bf16 or fp32")
        return torch.float16
    if cuda and not torch.cuda.is_bf16_supported():
        raise HydraEdgeError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16; "
                             "use --precision fp16 or fp32")
    if not cuda and not cpu_has_bf16():
        raise HydraEdgeError("--precision bf16: this CPU has no native bf16 (AVX512-BF16, AMX or Arm BF16); "
                             "use --precision fp32")
    return torch.bfloat16
