"""The training transform, per batch on the training device (kornia), and mixup/cutmix as soft targets.

Evaluation images keep the release's evaluation transform (``runtime.preprocess``), read the same
every time. Training images pass through, in timm's order: a random resized crop to the model's size
(bicubic), a horizontal flip, RandAugment, normalisation, random erasing, then mixup or cutmix,
which turn class ids into class probabilities. The pixel operations run on pixels in [0, 1], so a
batch read normalised (what both data sources yield) is denormalised first. With a random crop,
folder images are read a little larger than the model's size (the evaluation transform at
``resize_size(img_size)``: 248 px for 224), so the crop has more than the centre to choose from.

Two differences from timm's transforms, both kornia's: RandAugment draws its two operations once
per batch (each image its own sign and probability gate, not its own operations), and random erasing
fills the rectangle with 0, the mean colour after normalisation (timm's ``const`` mode, not DeiT's
per-pixel noise).
"""

from __future__ import annotations

import kornia.augmentation as K
import torch
from kornia.augmentation.auto import RandAugment
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from ..model.config import HydraConfig
from ..records.training import TrainSettings
from ..runtime.preprocess import normalisation, resize_size
from .data import ImageFolder

RAND_AUGMENT_OPS = 2  # operations per image, timm's default (rand-m9-mstd0.5-inc1 uses it)
KORNIA_PER_TIMM = 3  # timm's RandAugment magnitudes run 0-10, kornia's 0-30
ERASE_AREA, ERASE_ASPECT = (0.02, 1 / 3), (0.3, 3.3)  # timm's RandomErasing defaults
CROP_ASPECT = (3 / 4, 4 / 3)  # timm's (and torchvision's) RandomResizedCrop ratio
CUTMIX_SHARE = 0.5  # with both mixup and cutmix, the share of batches cut (timm's switch_prob)


def training_reads(dataset: Dataset, cfg: HydraConfig, settings: TrainSettings) -> Dataset:
    """What the training loader reads: a folder's images larger when a random crop will cut them
    down to the model's size; anything else as it is."""
    if settings.crop_scale and isinstance(dataset, ImageFolder):
        return ImageFolder(dataset.files, cfg, size=resize_size(cfg.img_size))
    return dataset


class SoftTargets(nn.Module):
    """Mixup or cutmix on a batch (kornia's ``RandomMixUpV2`` / ``RandomCutMixV2``) and the targets that
    go with it: per image, the two classes' probabilities in the proportion the pixels were mixed.

    ``mixup`` and ``cutmix`` are the Beta(a, a) parameters of the mixing share (0: off), as timm's
    ``Mixup`` takes them; with both, each batch is cut with probability ``CUTMIX_SHARE``, else mixed.
    Label smoothing is left to the loss (``F.cross_entropy(label_smoothing=...)`` smooths probability
    targets as it smooths class ids).
    """

    def __init__(self, mixup: float, cutmix: float, classes: int) -> None:
        super().__init__()
        self.classes = classes
        self.mixup = K.RandomMixUpV2(data_keys=["input", "class"]) if mixup else None
        self.share = torch.distributions.Beta(torch.tensor(float(mixup or 1)), torch.tensor(float(mixup or 1)))
        self.cutmix = K.RandomCutMixV2(beta=cutmix, data_keys=["input", "class"], use_correct_lambda=True) \
            if cutmix else None

    @property
    def active(self) -> bool:
        return self.mixup is not None or self.cutmix is not None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, class ids) -> (mixed images, (B, classes) probabilities that sum to 1)."""
        if self.cutmix is not None and (self.mixup is None or torch.rand(()) < CUTMIX_SHARE):
            x, mixed = self.cutmix(x, y)
            mixed = mixed[0]  # (B, 3): class, pasted image's class, share of the image kept
            other = 1 - mixed[:, 2]
        else:
            params = self.mixup.forward_parameters(x.shape)
            params["mixup_lambdas"] = self.share.sample((len(x),))  # kornia's own draw is uniform
            x, mixed = self.mixup(x, y, params=params)  # (B, 3): class, partner's class, partner's share
            other = mixed[:, 2]
        partner = F.one_hot(mixed[:, 1].long(), self.classes).to(x.dtype)
        own = F.one_hot(y, self.classes).to(x.dtype)
        return x, own * (1 - other)[:, None] + partner * other[:, None]


def _as_rgb(op: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``op`` (whose colour operations need RGB) on grayscale images: run on three equal channels, averaged back."""
    return op(x.expand(-1, 3, -1, -1)).mean(1, keepdim=True)


class TrainingTransform(nn.Module):
    """The per-batch training transform of ``settings`` for a model of ``cfg``; an identity when the
    recipe has no augmentation (the digits recipe), so such a run trains on exactly what it read."""

    def __init__(self, settings: TrainSettings, cfg: HydraConfig, classes: int) -> None:
        super().__init__()
        mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in normalisation(cfg.in_chans))
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)
        size = (cfg.img_size, cfg.img_size)
        self.crop = K.RandomResizedCrop(size, scale=(settings.crop_scale, 1.0), ratio=CROP_ASPECT, resample="BICUBIC",
                                        align_corners=False) if settings.crop_scale else None
        self.pixel_ops = nn.ModuleList(
            ([K.RandomHorizontalFlip()] if settings.flip else [])
            + ([RandAugment(n=RAND_AUGMENT_OPS, m=KORNIA_PER_TIMM * settings.rand_augment)] if settings.rand_augment
               else []))
        self.erase = K.RandomErasing(scale=ERASE_AREA, ratio=ERASE_ASPECT, value=0.0, p=settings.random_erasing) \
            if settings.random_erasing else None
        self.mix = SoftTargets(settings.mixup, settings.cutmix, classes)

    @property
    def active(self) -> bool:
        return self.crop is not None or len(self.pixel_ops) > 0 or self.erase is not None or self.mix.active

    @torch.no_grad()
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised images (B, C, H, W) and class ids -> augmented normalised images at the model's
        size, and class ids (no mixing) or (B, classes) probabilities."""
        if self.crop is not None or len(self.pixel_ops):
            x = x * self.std + self.mean  # pixels in [0, 1]
            if self.crop is not None:
                x = self.crop(x).clamp_(0.0, 1.0)  # bicubic overshoots; RandAugment expects [0, 1]
            for op in self.pixel_ops:
                x = op(x) if x.shape[1] == 3 else _as_rgb(op, x)
            x = (x - self.mean) / self.std
        if self.erase is not None:
            x = self.erase(x)
        return self.mix(x, y) if self.mix.active else (x, y)
