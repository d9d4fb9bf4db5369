"""The model config record: a HydraViT's sizes, as checkpoints and bundle manifests carry it."""

from __future__ import annotations

from typing import Annotated, List

import msgspec
from msgspec import Meta

from .fields import Heads

Size = Annotated[int, Meta(ge=1, le=1 << 16)]


class ModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A HydraViT's sizes as stored; ``hydra_edge.model.config.HydraConfig`` adds the derived sizes and checks."""

    img_size: Size = 224
    patch_size: Size = 16
    in_chans: Size = 3
    num_classes: Annotated[int, Meta(ge=1, le=1 << 24)] = 1000
    depth: Size = 12
    num_heads: Heads = 12
    head_dim: Size = 64
    mlp_ratio: Size = 4
    eps: Annotated[float, Meta(gt=0.0, le=1.0)] = 1e-6  # timm's ViT LayerNorm eps, the official release's
    heads: Annotated[List[Heads], Meta(min_length=1, max_length=1024)] = msgspec.field(
        default_factory=lambda: list(range(3, 13)))
    separate_heads: bool = False  # one classifier per head count (the paper's ablation)

