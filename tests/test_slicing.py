"""Subnetwork k's weights, checked against indices written out by hand for every parameter kind.

The digits preset: width 8 per head (D = 96 at 12 heads), MLP ratio 4. At k = 3 a subnetwork keeps
p = 24 features and h = 96 hidden units. The expected slices below are literal numbers, not calls
into ``hydra_edge.model.slicing``, so a wrong rule there cannot also be the test's expectation.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from hydra_edge import HydraViT
from hydra_edge.model.config import preset

QKV_ROWS_K3 = list(range(0, 24)) + list(range(96, 120)) + list(range(192, 216))  # q, k, v: first 24 of each

EXPECTED_K3 = {  # parameter -> (index into the 12-head tensor, shape of subnetwork 3's tensor)
    "cls_token": ((slice(None), slice(None), slice(0, 24)), (1, 1, 24)),
    "pos_embed": ((slice(None), slice(None), slice(0, 24)), (1, 17, 24)),
    "patch_embed.proj.weight": ((slice(0, 24),), (24, 1, 2, 2)),
    "patch_embed.proj.bias": ((slice(0, 24),), (24,)),
    "blocks.0.norm1.weight": ((slice(0, 24),), (24,)),
    "blocks.0.norm1.bias": ((slice(0, 24),), (24,)),
    "blocks.0.attn.qkv.weight": ((QKV_ROWS_K3, slice(0, 24)), (72, 24)),
    "blocks.0.attn.qkv.bias": ((QKV_ROWS_K3,), (72,)),
    "blocks.0.attn.proj.weight": ((slice(0, 24), slice(0, 24)), (24, 24)),
    "blocks.0.attn.proj.bias": ((slice(0, 24),), (24,)),
    "blocks.3.norm2.weight": ((slice(0, 24),), (24,)),
    "blocks.3.norm2.bias": ((slice(0, 24),), (24,)),
    "blocks.3.mlp.fc1.weight": ((slice(0, 96), slice(0, 24)), (96, 24)),
    "blocks.3.mlp.fc1.bias": ((slice(0, 96),), (96,)),
    "blocks.3.mlp.fc2.weight": ((slice(0, 24), slice(0, 96)), (24, 96)),
    "blocks.3.mlp.fc2.bias": ((slice(0, 24),), (24,)),
    "norm.weight": ((slice(0, 24),), (24,)),
    "norm.bias": ((slice(0, 24),), (24,)),
    "head.weight": ((slice(None), slice(0, 24)), (10, 24)),
    "head.bias": ((slice(None),), (10,)),
}


def _take(tensor: torch.Tensor, index: tuple) -> torch.Tensor:
    """``tensor[index]`` where a list picks rows (applied one axis at a time, as the hand-written index reads)."""
    for axis, i in enumerate(index):
        tensor = tensor.index_select(axis, torch.tensor(i)) if isinstance(i, list) else tensor[(slice(None),) * axis + (i,)]
    return tensor


@pytest.fixture(scope="module")
def model() -> HydraViT:
    torch.manual_seed(0)
    return HydraViT(preset("digits"))


def test_every_kind_of_parameter_of_subnetwork_3_is_the_hand_written_slice(model: HydraViT) -> None:
    full = dict(model.named_parameters())
    sub = dict(model.subnetwork(3).named_parameters())
    for name, (index, shape) in EXPECTED_K3.items():
        assert tuple(sub[name].shape) == shape, name
        assert torch.equal(sub[name], _take(full[name].detach(), index)), name


def _kind(name: str) -> str:
    return name.split(".", 2)[-1] if name.startswith("blocks.") else name  # blocks.3.mlp.fc1.weight -> mlp.fc1.weight


def test_the_hand_written_table_covers_every_kind_of_parameter(model: HydraViT) -> None:
    assert {_kind(name) for name, _ in model.named_parameters()} == {_kind(name) for name in EXPECTED_K3}


def test_twelve_heads_keep_every_weight_whole(model: HydraViT) -> None:
    full = dict(model.named_parameters())
    for name, p in model.subnetwork(12).named_parameters():
        assert torch.equal(p, full[name].detach()), name


def test_separate_classifiers_give_subnetwork_k_its_own_head() -> None:
    torch.manual_seed(1)
    model = HydraViT(msgspec.structs.replace(preset("digits"), separate_heads=True))
    full = dict(model.named_parameters())
    sub = dict(model.subnetwork(5).named_parameters())  # p = 40
    assert torch.equal(sub["head.weight"], full["heads.5.weight"].detach()[:, 0:40])
    assert torch.equal(sub["head.bias"], full["heads.5.bias"].detach())
