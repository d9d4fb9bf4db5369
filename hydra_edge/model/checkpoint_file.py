"""The checkpoint file itself: how hydra-edge writes one, and how any checkpoint is read safely.

Apart from ``checkpoint`` (which builds models from files) so that ``HydraViT.save`` needs no
import of the loader, which imports the model.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import atomic_path
from ..errors import CheckpointError

FORMAT_KEY, FORMAT_VERSION = "hydra_edge", 1  # marks hydra-edge's own files, which carry their config


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint file without executing code (weights_only), or fail with one line."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        # timm training checkpoints carry their argparse namespace under 'args'.
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a non-checkpoint; all mean the same here
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({reason[:120]})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a checkpoint dictionary")
    return obj


def save_checkpoint(model: nn.Module, path: str | Path, **extra: Any) -> None:
    """Write a checkpoint with the config inside; ``extra`` (optimizer, history, data) rides along."""
    obj = {FORMAT_KEY: FORMAT_VERSION, "config": model.config.to_dict(), "state_dict": model.state_dict(), **extra}
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
