"""Export-time forms of a subnetwork keep its parameters and its logits, and do less work."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from hydra_edge.convert.rewrites import (HeadsApartAttention, bmm_attention, centred_layer_norm, class_token_only,
                                         heads_apart, patch_linear, patch_rows, rewritten)
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.vit import VisionTransformer

REWRITES = [class_token_only, bmm_attention, patch_linear, patch_rows, centred_layer_norm]


@pytest.fixture(scope="module")
def subnet() -> VisionTransformer:
    """Subnetwork 3 of a depth-3 ViT on 3-channel 8x8 images (a patch's (C, p, p) order matters), its
    LayerNorms scaled and shifted as a trained model's are (a new one's are 1 and 0)."""
    torch.manual_seed(0)
    subnet = HydraViT(preset("digits", depth=3, in_chans=3), init_scheme="torch-default").subnetwork(3).eval()
    with torch.no_grad():
        for m in subnet.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return subnet


@pytest.mark.parametrize("changes", [[r] for r in REWRITES] + [[bmm_attention, heads_apart],
                                                                [class_token_only, bmm_attention, patch_linear],
                                                                [class_token_only, bmm_attention, heads_apart, patch_rows,
                                                                 centred_layer_norm]],
                         ids=[*(r.__name__ for r in REWRITES), "heads_apart", "composed", "composed for LiteRT"])
def test_a_rewrite_keeps_every_parameter_and_the_logits(subnet: VisionTransformer,
                                                        changes: list[Callable[[VisionTransformer], None]]) -> None:
    before = {n: p.clone() for n, p in subnet.named_parameters()}
    changed = rewritten(subnet, *changes)
    theirs = dict(changed.named_parameters())
    assert list(theirs) == list(before) and all(torch.equal(theirs[n], p) for n, p in before.items())
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(changed(x), subnet(x), rtol=1e-5, atol=1e-5)
    assert [type(m) for m in subnet.modules()] == [type(m) for m in HydraViT(
        preset("digits", depth=3, in_chans=3)).subnetwork(3).modules()]  # the caller's model is left as it was


def test_heads_apart_reaches_every_attention_and_keeps_the_class_token_query() -> None:
    """After ``class_token_only`` the last attention still asks with the class token alone."""
    subnet = HydraViT(preset("digits", depth=2, in_chans=3), init_scheme="torch-default").subnetwork(3).eval()
    changed = rewritten(subnet, class_token_only, bmm_attention, heads_apart)
    assert [type(b.attn) for b in changed.blocks] == [HeadsApartAttention] * 2
    assert [b.attn.queries for b in changed.blocks] == [None, 1]


@pytest.mark.parametrize("changes", [[class_token_only], [class_token_only, bmm_attention, heads_apart]],
                         ids=["class_token_only", "then heads_apart"])
def test_the_last_block_works_on_the_class_token_alone(subnet: VisionTransformer,
                                                       changes: list[Callable[[VisionTransformer], None]]) -> None:
    tokens: dict[str, int] = {}
    changed = rewritten(subnet, *changes)
    for name, m in changed.named_modules():
        if name.endswith(("mlp.fc1", "attn.proj")) or name == "norm":
            m.register_forward_hook(lambda m, args, out, name=name: tokens.__setitem__(name, args[0].shape[1]))
    with torch.no_grad():
        changed(torch.randn(2, 3, 8, 8))
    everyone = subnet.config.num_patches + 1
    assert tokens == {"blocks.0.attn.proj": everyone, "blocks.0.mlp.fc1": everyone,
                      "blocks.1.attn.proj": everyone, "blocks.1.mlp.fc1": everyone,
                      "blocks.2.attn.proj": 1, "blocks.2.mlp.fc1": 1, "norm": 1}


def test_a_module_that_is_not_a_vit_exports_as_it_is() -> None:
    layer = torch.nn.Linear(4, 4)
    changed = rewritten(layer, class_token_only, bmm_attention, patch_linear)
    assert type(changed) is torch.nn.Linear and torch.equal(changed.weight, layer.weight)
