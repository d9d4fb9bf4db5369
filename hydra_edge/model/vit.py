"""A plain, dense Vision Transformer with timm's key layout.

This is what a subnetwork *is*: ``HydraViT.subnetwork(k)`` returns one of these, of width
``head_dim * k``, with copied weights and no slicing left, so every exporter sees an ordinary ViT.
Attention is written out (no fused SDPA) so that every converter lowers it the same way; training asks
for fused attention and drop path (``fused_attention``, ``drop_path_rate``), which no exported model has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HydraEdgeError
from .config import HydraConfig

# How a new model's weights are first set (``VisionTransformer.init_weights``).
INIT_SCHEMES = ("timm", "torch-default")


class PatchEmbed(nn.Module):
    def __init__(self, cfg: HydraConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, patches, D)


def drop_path(x: torch.Tensor, rate: float) -> torch.Tensor:
    """Stochastic depth (timm's ``drop_path``): each sample's residual branch ``x`` dropped with
    probability ``rate``, the kept ones scaled by 1 / (1 - rate) so the expectation is unchanged."""
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class Attention(nn.Module):
    def __init__(self, cfg: HydraConfig, fused: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.fused = fused  # scaled_dot_product_attention: the same function, less memory and time
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, N, head_dim)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)  # scale head_dim ** -0.5, its default
        else:
            attn = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)  # (B, heads, N, N)
            x = attn.softmax(dim=-1) @ v  # (B, heads, N, head_dim)
        return self.proj(x.transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    def __init__(self, cfg: HydraConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_ratio * cfg.embed_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.embed_dim, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: HydraConfig, fused_attention: bool = False, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.eps)
        self.attn = Attention(cfg, fused_attention)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.eps)
        self.mlp = Mlp(cfg)
        self.drop_path_rate = drop_path_rate  # applied in training only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._branch(self.attn(self.norm1(x)))
        return x + self._branch(self.mlp(self.norm2(x)))

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_path_rate) if self.training and self.drop_path_rate > 0 else x


class VisionTransformer(nn.Module):
    """ViT with a cls token, learned position embedding and cls-token pooling (DeiT without distillation).

    ``fused_attention`` and ``drop_path_rate`` are for training (the rate rises linearly over the blocks
    from 0 to ``drop_path_rate``, as in timm and DeiT); a model built without them is the plain graph
    every exporter lowers.
    """

    def __init__(self, cfg: HydraConfig, fused_attention: bool = False, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.config = cfg
        D = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, D))
        rates = [drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # torch.linspace's
        self.blocks = nn.ModuleList(Block(cfg, fused_attention, rate) for rate in rates)
        self.norm = nn.LayerNorm(D, eps=cfg.eps)
        if cfg.separate_heads:
            self.heads = nn.ModuleDict({str(k): nn.Linear(cfg.head_dim * k, cfg.num_classes) for k in cfg.heads})
        else:
            self.head = nn.Linear(D, cfg.num_classes)

    def init_weights(self, scheme: str = "timm") -> None:
        """Set the weights of a new model: position embedding truncated normal (std 0.02), cls token normal
        (std 1e-6), and the linears by ``scheme``.

        ``"timm"``: truncated normal (std 0.02) with zero biases, timm's ViT habit. ``"torch-default"``:
        the linears keep what ``nn.Linear`` gave them (Kaiming-uniform weights, uniform biases), which is
        what the official HydraViT code trains from: its sliceable linears are not ``nn.Linear``, so
        timm's initialisation never reaches them. Patch embedding and LayerNorms keep PyTorch's
        defaults in both, as in timm and the official code.
        """
        if scheme not in INIT_SCHEMES:
            raise HydraEdgeError(f"unknown initialisation {scheme!r}; choose one of {', '.join(INIT_SCHEMES)}")
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if scheme == "timm":
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, patches, D)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)  # (B, patches + 1, D)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x[:, 0])  # (B, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
