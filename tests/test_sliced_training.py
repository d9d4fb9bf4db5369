"""Training the sliced model: a new classifier for new classes, and the training forward's speed-ups
(fused attention, views instead of gathers, drop path, bf16) computing what the official forward does."""

from __future__ import annotations

import pytest
import torch

from hydra_edge import HydraEdgeError, HydraViT
from hydra_edge.model.config import preset


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
