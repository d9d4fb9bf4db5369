"""HydraViT: one ViT whose first k heads form a working subnetwork for every k."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import torch
from torch import nn
from torch.func import functional_call

from ..atomic import atomic_path
from ..errors import HydraEdgeError
from .config import HydraConfig, preset
from .slicing import slice_state
from .vit import VisionTransformer

FORMAT_KEY, FORMAT_VERSION = "hydra_edge", 1  # marks hydra-edge's own files, which carry their config


class HydraViT(VisionTransformer):
    """A full-width ViT (timm key layout) that runs any of its subnetworks.

    ``model(x, heads=k)`` runs subnetwork k by slicing the full weights (gradients reach the
    shared weights, which is how stochastic head sampling trains them); ``model.subnetwork(k)``
    copies those slices into a standalone dense ViT for export.

    In training mode the sliced forward uses fused attention and drop path (``drop_path_rate``, a
    training setting the training loop sets, not part of the config); in evaluation it runs the
    written-out graph of ``subnetwork(k)``, the one every converter lowers and verification compares.
    """

    def __init__(self, cfg: HydraConfig, init_scheme: str = "timm") -> None:
        super().__init__(cfg)
        self.init_weights(init_scheme)
        # Dense k-head ViTs on the meta device, for training and for evaluation: structure only, run
        # with sliced weights. A plain dict so they are neither parameters nor part of the state dict.
        self._skeletons: dict[tuple[int, bool], VisionTransformer] = {}
        self._drop_path_rate = 0.0

    @property
    def drop_path_rate(self) -> float:
        """Stochastic depth in training: the last block's rate, rising linearly from 0 at the first."""
        return self._drop_path_rate

    @drop_path_rate.setter
    def drop_path_rate(self, rate: float) -> None:
        if not 0.0 <= rate < 1.0:
            raise HydraEdgeError(f"drop path rate {rate} must lie in [0, 1); the DeiT recipe uses 0.1")
        self._drop_path_rate = float(rate)
        self._skeletons.clear()  # the training ones carry the old rate

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "HydraViT":
        """``HydraViT.from_preset("b16")``: the paper's ViT-B/16; ``"digits"``: the built-in data's."""
        return cls(preset(name, **overrides))

    def _skeleton(self, k: int) -> VisionTransformer:
        key = (k, self.training)
        if key not in self._skeletons:
            with torch.device("meta"):
                skeleton = VisionTransformer(self.config.narrowed(k), fused_attention=self.training,
                                             drop_path_rate=self._drop_path_rate if self.training else 0.0)
            self._skeletons[key] = skeleton.train(self.training)
        return self._skeletons[key]

    def _check_served(self, k: int) -> None:
        self.config.check_heads(k)
        if self.config.separate_heads and k not in self.config.heads:
            raise HydraEdgeError(
                f"this model has classifiers only for head counts {list(self.config.heads)}, not {k}"
            )

    def forward(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """Logits of subnetwork ``heads`` (default: the largest served head count)."""
        k = max(self.config.heads) if heads is None else int(heads)
        self._check_served(k)
        params = slice_state(dict(self.named_parameters()), self.config, k)
        return functional_call(self._skeleton(k), params, (x,), strict=True)

    @torch.no_grad()
    def reset_classifier(self, num_classes: int) -> None:
        """Give the model a new, freshly initialised classifier of ``num_classes`` outputs (every
        per-head-count classifier when they are separate), keeping the backbone: how a trained model
        reaches a new set of classes. Initialised as timm does (truncated normal, std 0.02; zero bias)."""
        if int(num_classes) < 1:
            raise HydraEdgeError(f"a classifier needs at least one class, not {num_classes}")
        ref = self.norm.weight  # the backbone's device and dtype

        def linear(width: int) -> nn.Linear:
            layer = nn.Linear(width, int(num_classes), device=ref.device, dtype=ref.dtype)
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
            return layer

        if self.config.separate_heads:
            self.heads = nn.ModuleDict({str(k): linear(self.config.width(k)) for k in self.config.heads})
        else:
            self.head = linear(self.config.embed_dim)
        self.config = msgspec.structs.replace(self.config, num_classes=int(num_classes))
        self._skeletons.clear()  # their classifiers have the old width

    @torch.no_grad()
    def subnetwork(self, k: int) -> VisionTransformer:
        """A standalone dense ViT of ``k`` heads with copied weights and no slicing ops."""
        self._check_served(k)
        sub = VisionTransformer(self.config.narrowed(k))
        state = slice_state(dict(self.named_parameters()), self.config, k)
        sub.load_state_dict({n: t.detach().clone() for n, t in state.items()}, strict=True)
        return sub.eval()

    def save(self, path: str | Path, **extra: Any) -> None:
        """Write hydra-edge's own checkpoint: the config inside, so the file alone rebuilds the model, and
        ``extra`` (optimizer, history, data) beside the weights; atomically, so a crash keeps the old file.
        ``model.checkpoint`` reads it, and every other layout."""
        obj = {FORMAT_KEY: FORMAT_VERSION, "config": self.config.to_dict(), "state_dict": self.state_dict(), **extra}
        with atomic_path(path) as tmp:
            torch.save(obj, tmp)
