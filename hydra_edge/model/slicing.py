"""Where a head count is sliced: the one definition of which weights subnetwork k uses.

For every parameter of the full model, ``weight_index`` gives the index of the part that
subnetwork k keeps (docs/hydravit.md, "sliced, not masked"). Reading through it materialises or runs a
subnetwork; writing through it initialises the first heads from a narrower DeiT checkpoint.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from .config import HydraConfig

Index = tuple  # a tuple of slices and index tensors, usable as tensor[index]

_ALL = slice(None)


def _qkv_rows(cfg: HydraConfig, p: int) -> torch.Tensor:
    """Rows [0:p] ∪ [D:D+p] ∪ [2D:2D+p]: the first p features of q, of k and of v."""
    D = cfg.embed_dim
    return torch.cat([torch.arange(i * D, i * D + p) for i in range(3)])


def weight_index(name: str, cfg: HydraConfig, k: int) -> Index:
    """Index into full-model parameter ``name`` of the part subnetwork ``k`` uses."""
    p = cfg.width(k)
    h = cfg.mlp_ratio * p
    first_p = slice(0, p)
    if name in ("cls_token", "pos_embed"):
        return (_ALL, _ALL, first_p)  # (1, tokens, D)
    if name == "head.weight":
        return (_ALL, first_p)  # (classes, D)
    if name == "head.bias" or name.startswith("heads."):
        return (_ALL,)
    if name.endswith("attn.qkv.weight"):
        return (_qkv_rows(cfg, p), first_p)
    if name.endswith("attn.qkv.bias"):
        return (_qkv_rows(cfg, p),)
    if name.endswith("attn.proj.weight"):
        return (first_p, first_p)
    if name.endswith("mlp.fc1.weight"):
        return (slice(0, h), first_p)
    if name.endswith("mlp.fc1.bias"):
        return (slice(0, h),)
    if name.endswith("mlp.fc2.weight"):
        return (first_p, slice(0, h))
    # patch_embed.proj.{weight,bias}, norms, attn.proj.bias, mlp.fc2.bias: the first p outputs
    return (first_p,)


_SEPARATE_HEAD = re.compile(r"^heads\.(\d+)\.(weight|bias)$")


def subnetwork_name(name: str, k: int) -> str | None:
    """The parameter name in the dense k-head ViT, or None if subnetwork k does not use it.

    Only a per-head-count classifier is special: ``heads.<k>.*`` becomes ``head.*``; the
    classifiers of other head counts are not part of subnetwork k.
    """
    m = _SEPARATE_HEAD.match(name)
    if m:
        return f"head.{m.group(2)}" if int(m.group(1)) == k else None
    return name


def _qkv_blocks(tensor: torch.Tensor, cfg: HydraConfig, k: int) -> torch.Tensor:
    """``tensor[weight_index(...)]`` of a qkv weight (3D, D) or bias (3D), without an index: the three
    blocks sliced out of a (3, D, ...) view and joined by a reshape. At k = num_heads that is a view
    (nothing copied); otherwise one copy of the slice, and the backward writes a slice where an
    index would scatter (the training step's slicing cost)."""
    D, p = cfg.embed_dim, cfg.width(k)
    blocks = tensor.view(3, D, *tensor.shape[1:])[(_ALL, slice(0, p)) + (slice(0, p),) * (tensor.dim() - 1)]
    return blocks.reshape(3 * p, *blocks.shape[2:])


def slice_state(params: Mapping[str, torch.Tensor], cfg: HydraConfig, k: int) -> dict[str, torch.Tensor]:
    """The parameters of subnetwork k, keyed as in the dense k-head ViT; differentiable, so the sliced
    forward trains the shared weights. The same tensors as ``weight_index`` gives, read as views
    (qkv: ``_qkv_blocks``), since this runs at every training step."""
    out = {}
    for name, tensor in params.items():
        sub = subnetwork_name(name, k)
        if sub is None:
            continue
        qkv = name.endswith(("attn.qkv.weight", "attn.qkv.bias"))
        out[sub] = _qkv_blocks(tensor, cfg, k) if qkv else tensor[weight_index(name, cfg, k)]
    return out
