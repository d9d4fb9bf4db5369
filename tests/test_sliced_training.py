"""Training the sliced model: a new classifier for new classes, and the training forward's speed-ups
(fused attention, views instead of gathers, drop path, bf16) computing what the official forward does."""

from __future__ import annotations

import msgspec
import pytest
import torch
import torch.nn.functional as F

from hydra_edge import HydraEdgeError, HydraViT
from hydra_edge.model.config import preset
from hydra_edge.model.slicing import slice_state, subnetwork_name, weight_index
from hydra_edge.model.vit import VisionTransformer


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("num_classes", [4, 17])
def test_reset_classifier_gives_new_classes_and_keeps_the_backbone(separate, num_classes):
    torch.manual_seed(0)
    model = HydraViT(preset("digits", heads=(3, 6, 12), separate_heads=separate))
    before = {n: p.clone() for n, p in model.state_dict().items() if not n.startswith("head")}
    model(torch.randn(1, 1, 8, 8), heads=3)  # builds a skeleton with the old classifier width
    model.reset_classifier(num_classes)
    assert model.config.num_classes == num_classes
    after = model.state_dict()
    assert all(torch.equal(after[n], t) for n, t in before.items())
    classifiers = [model.heads[str(k)] for k in (3, 6, 12)] if separate else [model.head]
    for layer in classifiers:
        assert layer.out_features == num_classes
        assert torch.count_nonzero(layer.bias) == 0
        assert 0.015 < layer.weight.std() < 0.025  # trunc-normal, std 0.02 (truncated at +-2, as timm)
    x = torch.randn(2, 1, 8, 8)
    for k in (3, 6, 12):
        assert model(x, heads=k).shape == (2, num_classes)
        with torch.no_grad():
            assert (model.eval()(x, heads=k) - model.subnetwork(k)(x)).abs().max() <= 1e-5


def test_reset_classifier_follows_the_backbones_dtype():
    model = HydraViT.from_preset("digits").to(torch.float64)
    model.reset_classifier(3)
    assert model.head.weight.dtype == torch.float64
    assert model(torch.randn(1, 1, 8, 8, dtype=torch.float64)).shape == (1, 3)


def test_reset_classifier_refuses_no_classes(digits_model):
    with pytest.raises(HydraEdgeError, match="at least one class"):
        digits_model.reset_classifier(0)


def _scattered_subnetwork_grads(model: HydraViT, k: int, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of the dense ``subnetwork(k)`` (explicit attention, copied weights), written into
    full-size zeros through ``weight_index``: what the sliced forward must give the shared weights."""
    dense = model.subnetwork(k).train()
    dense.zero_grad()
    F.cross_entropy(dense(x), y).backward()
    grads = dict(dense.named_parameters())
    full = {}
    for name, param in model.named_parameters():
        full[name] = torch.zeros_like(param)
        sub = subnetwork_name(name, k)
        if sub is not None:
            full[name][weight_index(name, model.config, k)] = grads[sub].grad
    return full


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("k", [3, 6, 12])
def test_training_forward_is_the_subnetwork_fused_and_trains_exactly_its_weights(b16_like, separate, k):
    """Training runs fused attention on views of the shared weights; its logits and gradients are those of
    the dense subnetwork (explicit attention, weights copied through weight_index) to float rounding."""
    torch.manual_seed(k)
    model = HydraViT(msgspec.structs.replace(b16_like, heads=(3, 6, 12), separate_heads=separate)).train()
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    expected = _scattered_subnetwork_grads(model, k, x, y)
    with torch.no_grad():
        assert torch.allclose(model(x, heads=k), model.subnetwork(k)(x), rtol=1e-4, atol=1e-5)
    F.cross_entropy(model(x, heads=k), y).backward()
    for name, param in model.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad  # another k's classifier: no grad
        assert torch.allclose(grad, expected[name], rtol=1e-4, atol=1e-6), name
        assert bool(expected[name].any()) == (subnetwork_name(name, k) is not None), name


def test_training_uses_fused_attention_and_evaluation_the_exported_graph(b16_like, monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    model = HydraViT(b16_like)
    x = torch.randn(2, 3, 32, 32)
    model.train()(x, heads=6)
    assert calls == [1]  # one block, one fused attention
    model.eval()(x, heads=6)
    model.subnetwork(6)(x)
    assert calls == [1]


def test_slicing_copies_nothing_at_the_full_head_count(b16_like):
    model = HydraViT(b16_like)
    params = dict(model.named_parameters())
    for name, tensor in slice_state(params, model.config, 12).items():
        assert tensor.data_ptr() == params[name].data_ptr() and tensor.shape == params[name].shape, name
    qkv = slice_state(params, model.config, 3)["blocks.0.attn.qkv.weight"]
    assert torch.equal(qkv, params["blocks.0.attn.qkv.weight"][weight_index("blocks.0.attn.qkv.weight", model.config, 3)])


def test_drop_path_drops_residual_branches_in_training_only(digits_model):
    x = torch.randn(64, 1, 8, 8)
    digits_model.eval()
    with torch.no_grad():
        plain = digits_model(x, heads=6)
        digits_model.drop_path_rate = 0.5
        assert torch.equal(digits_model(x, heads=6), plain)  # off in evaluation
        digits_model.train()
        torch.manual_seed(1)
        first = digits_model(x, heads=6)
        torch.manual_seed(2)
        second = digits_model(x, heads=6)
        torch.manual_seed(1)
        assert torch.equal(digits_model(x, heads=6), first)  # random only through torch's generator
        digits_model.drop_path_rate = 0.0
        undropped = digits_model(x, heads=6)
    changed = (first - undropped).abs().amax(-1) > 1e-4  # per sample: some branch dropped or rescaled
    assert changed.all() and not torch.allclose(first, second)
    assert torch.allclose(undropped, plain, atol=1e-5)
    assert "drop_path" not in str(digits_model.config.to_dict())


def test_drop_path_rate_rises_linearly_over_the_blocks_and_is_checked(digits_model):
    rates = [b.drop_path_rate for b in VisionTransformer(digits_model.config, drop_path_rate=0.1).blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.1, digits_model.config.depth).tolist())
    with pytest.raises(HydraEdgeError, match=r"drop path rate 1.0 must lie in \[0, 1\)"):
        digits_model.drop_path_rate = 1.0


def test_a_bf16_training_step_runs_on_the_cpu_close_to_fp32(b16_like):
    torch.manual_seed(0)
    model = HydraViT(b16_like).train()
    model.drop_path_rate = 0.1
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    losses = {}
    for dtype in (None, torch.bfloat16):
        model.zero_grad()
        torch.manual_seed(1)  # the same drop-path draws
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x, heads=6)
            losses[dtype] = F.cross_entropy(logits, y)
        assert logits.dtype == (dtype or torch.float32)
        losses[dtype].backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert torch.isfinite(losses[torch.bfloat16])
    assert losses[torch.bfloat16].item() == pytest.approx(losses[None].item(), rel=2e-2)
