"""The sliced forward pass and materialised subnetworks are the same network, sliced as docs/hydravit.md says."""

from __future__ import annotations

import pytest
import torch

from hydra_edge import HydraEdgeError, HydraViT
from hydra_edge.model.config import HydraConfig, parse_heads, preset
from hydra_edge.model.slicing import weight_index


def test_subnetwork_equals_sliced_forward_for_every_small_head_count(digits_model):
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        for k in range(1, 13):
            dense = digits_model.subnetwork(k)
            assert dense.config.embed_dim == 8 * k
            assert (digits_model(x, heads=k) - dense(x)).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def b16_model() -> HydraViT:
    """One b16 with random weights (86 M parameters: built once for every head count tested)."""
    torch.manual_seed(0)
    return HydraViT.from_preset("b16")


@pytest.mark.parametrize("k", [3, 7, 12])
def test_b16_subnetworks_equal_sliced_forward(b16_model, k):
    torch.manual_seed(k)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (b16_model(x, heads=k) - b16_model.subnetwork(k)(x)).abs().max() <= 1e-5


def test_subnetworks_have_deit_shapes():
    cfg = preset("b16")
    with torch.device("meta"):
        model = HydraViT(cfg)
        tiny = {n: tuple(p.shape) for n, p in model.subnetwork(3).named_parameters()}
    assert tiny["blocks.0.attn.qkv.weight"] == (576, 192)
    assert tiny["blocks.0.mlp.fc1.weight"] == (768, 192)
    assert tiny["pos_embed"] == (1, 197, 192)
    assert tiny["head.weight"] == (1000, 192)


def test_qkv_keeps_the_first_p_rows_of_q_k_and_v():
    cfg = HydraConfig(img_size=32, depth=1, num_classes=10)
    full = torch.arange(3 * 768 * 768).reshape(3 * 768, 768)
    rows = full[weight_index("blocks.0.attn.qkv.weight", cfg, 2)][:, 0] // 768
    assert rows.tolist() == list(range(0, 128)) + list(range(768, 896)) + list(range(1536, 1664))


def test_subnetwork_exports_without_slicing_ops(digits_model):
    ep = torch.export.export(digits_model.subnetwork(5), (torch.randn(1, 1, 8, 8),))
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert not {op for op in ops if "slice" in op or "index" in op}, ops
    assert "aten.linear.default" in ops


def test_gradients_reach_only_the_sampled_heads(digits_model):
    digits_model(torch.randn(2, 1, 8, 8), heads=3).sum().backward()
    qkv = digits_model.blocks[0].attn.qkv.weight.grad  # (3 * 96, 96): q, k, v rows
    for start in (0, 96, 192):  # the first 24 rows of each of q, k, v, and nothing else
        assert qkv[start:start + 24, :24].abs().sum() > 0
        assert qkv[start + 24:start + 96].abs().sum() == 0
    assert qkv[:, 24:].abs().sum() == 0


def test_head_count_out_of_range_is_a_clear_error(digits_model):
    with pytest.raises(HydraEdgeError, match="head count 13 is out of range"):
        digits_model(torch.randn(1, 1, 8, 8), heads=13)


def test_separate_classifiers_serve_only_their_head_counts():
    model = HydraViT(preset("digits", heads=(3, 6), separate_heads=True))
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert (model(x, heads=6) - model.subnetwork(6)(x)).abs().max() <= 1e-5
    assert torch.equal(model.subnetwork(3).head.weight, model.heads["3"].weight)
    assert set(model.state_dict()) >= {"heads.3.weight", "heads.6.weight"}
    with pytest.raises(HydraEdgeError, match=r"classifiers only for head counts \[3, 6\]"):
        model(x, heads=4)


@pytest.mark.parametrize("text, expected", [("3-12", tuple(range(3, 13))), ("3,6,12", (3, 6, 12)), ("6,3-4", (3, 4, 6))])
def test_parse_heads(text, expected):
    assert parse_heads(text, 12) == expected


@pytest.mark.parametrize("text", ["0-4", "13", "a-b", ""])
def test_parse_heads_rejects_bad_input(text):
    with pytest.raises(HydraEdgeError):
        parse_heads(text, 12)


def test_torch_default_init_keeps_what_nn_linear_gave_and_timm_init_replaces_it(b16_like):
    """The official code's linears keep PyTorch's Kaiming-uniform init; timm's are truncated normal, zero bias."""
    from torch import nn

    from hydra_edge.model.vit import VisionTransformer

    torch.manual_seed(7)
    bare = VisionTransformer(b16_like)  # every module as its constructor left it
    torch.manual_seed(7)
    official = HydraViT(b16_like, init_scheme="torch-default")
    torch.manual_seed(7)
    timm = HydraViT(b16_like)
    linears = [name for name, m in bare.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 5  # qkv, proj, fc1, fc2 of the one block, and the classifier
    for name in linears:
        b, o, t = (dict(m.named_modules())[name] for m in (bare, official, timm))
        assert torch.equal(o.weight, b.weight) and torch.equal(o.bias, b.bias), name
        bound = o.weight.shape[1] ** -0.5  # nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias
        assert o.weight.abs().max() <= bound and o.bias.abs().max() <= bound and o.bias.abs().min() > 0, name
        assert not torch.equal(t.weight, b.weight) and torch.count_nonzero(t.bias) == 0, name
    qkv = timm.blocks[0].attn.qkv.weight
    assert abs(qkv.std().item() - 0.02) < 0.0005 and qkv.abs().max() > 1.5 * 768 ** -0.5  # normal tails
    for name in ("pos_embed", "cls_token"):  # the same in both schemes, drawn before the linears
        assert torch.equal(getattr(official, name), getattr(timm, name))
    assert abs(official.pos_embed.std().item() - 0.02) < 0.002 and torch.count_nonzero(bare.pos_embed) == 0
    with pytest.raises(HydraEdgeError, match="unknown initialisation 'jax'; choose one of timm, torch-default"):
        HydraViT(b16_like, init_scheme="jax")
