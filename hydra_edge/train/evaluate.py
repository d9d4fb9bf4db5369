"""Accuracy per head count: the number every later stage (conversion, lookup table) trades against latency."""

from __future__ import annotations

from typing import Iterable

import torch
from torch.utils.data import DataLoader, Dataset

from ..model.config import HydraConfig
from ..model.hydravit import HydraViT
from ..model.sizes import subnet_size


@torch.no_grad()
def accuracy_per_heads(
    model: HydraViT, dataset: Dataset, heads: Iterable[int], batch_size: int = 256, workers: int = 0,
    autocast: torch.dtype | None = None,
) -> dict[int, float]:
    """Top-1 accuracy (%) of each subnetwork on ``dataset``, one pass over the data (decoded by ``workers``
    processes), under ``autocast`` when given (what training runs in; None: fp32)."""
    heads = list(heads)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = {k: torch.zeros((), dtype=torch.long, device=device) for k in heads}  # summed on the device
    total = 0
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=device.type == "cuda")
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        total += len(y)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            for k in heads:
                correct[k] += (model(x, heads=k).argmax(-1) == y).sum()
    model.train(was_training)
    return {k: 100.0 * int(correct[k]) / max(total, 1) for k in heads}


def accuracy_rows(cfg: HydraConfig, accuracy: dict[int, float]) -> list[dict]:
    """Accuracy joined with each subnetwork's size: the table users read and plot."""
    return [
        {"heads": k, "width": s.width, "params": s.params, "gmacs": s.gmacs, "top1": accuracy[k]}
        for k in sorted(accuracy)
        for s in [subnet_size(cfg, k)]
    ]
