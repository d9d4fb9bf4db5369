"""Accuracy per head count: the number every later stage (conversion, lookup table) trades against latency."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..model.config import HydraConfig
from ..model.hydravit import HydraViT
from ..model.sizes import subnet_size


@torch.no_grad()
def right_per_heads(
    model: HydraViT, dataset: Dataset, heads: Iterable[int], batch_size: int = 256, workers: int = 0,
    autocast: torch.dtype | None = None,
) -> dict[int, np.ndarray]:
    """Whether each subnetwork gets each image of ``dataset`` right (top-1), one pass over the data (decoded
    by ``workers`` processes), under ``autocast`` when given (what training runs in; None: fp32): outcomes
    paired by image, which judge one head count against another on the same images, not on two counts."""
    heads = list(heads)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    right: dict[int, list[torch.Tensor]] = {k: [] for k in heads}  # kept on the device until the end
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=device.type == "cuda")
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            for k in heads:
                right[k].append(model(x, heads=k).argmax(-1) == y)
    model.train(was_training)
    return {k: torch.cat(r).cpu().numpy() if r else np.zeros(0, bool) for k, r in right.items()}


def top1(right: dict[int, np.ndarray]) -> dict[int, float]:
    """Top-1 accuracy (%) per head count from its per-image outcomes (0 on no images)."""
    return {k: 100.0 * int(r.sum()) / max(len(r), 1) for k, r in right.items()}


def accuracy_per_heads(
    model: HydraViT, dataset: Dataset, heads: Iterable[int], batch_size: int = 256, workers: int = 0,
    autocast: torch.dtype | None = None,
) -> dict[int, float]:
    """Top-1 accuracy (%) of each subnetwork on ``dataset`` (``right_per_heads``, counted)."""
    return top1(right_per_heads(model, dataset, heads, batch_size, workers, autocast))


def accuracy_rows(cfg: HydraConfig, accuracy: dict[int, float]) -> list[dict]:
    """Accuracy joined with each subnetwork's size: the table users read and plot."""
    return [
        {"heads": k, "width": s.width, "params": s.params, "gmacs": s.gmacs, "top1": accuracy[k]}
        for k in sorted(accuracy)
        for s in [subnet_size(cfg, k)]
    ]
