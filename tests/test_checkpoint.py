"""Checkpoints in every supported layout load; bad ones fail with one line and load nothing."""

from __future__ import annotations

import argparse

import pytest
import torch
from click.testing import CliRunner

from hydra_edge import HydraViT, init_heads_from, load_checkpoint
from hydra_edge.checkpoint import load_state
from hydra_edge.cli import main
from hydra_edge.errors import CheckpointError
from hydra_edge.vit import VisionTransformer


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_own_checkpoint_round_trips_with_its_config(tmp_path, digits_model):
    digits_model.save(tmp_path / "m.pt")
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert loaded.config == digits_model.config
    assert _same(loaded, digits_model)


def test_official_release_layout_loads_with_inferred_config(tmp_path, b16_like):
    """timm training checkpoint: state_dict + state_dict_ema + argparse args, DDP 'module.' prefix."""
    torch.manual_seed(1)
    model, ema = HydraViT(b16_like), HydraViT(b16_like)
    torch.save({
        "epoch": 299, "arch": "hydravit_dyn_patch16_224", "args": argparse.Namespace(lr=5e-4),
        "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
        "state_dict_ema": ema.state_dict(), "version": 2,
    }, tmp_path / "release.pth.tar")
    loaded = load_checkpoint(tmp_path / "release.pth.tar")
    assert (loaded.config.num_heads, loaded.config.head_dim, loaded.config.img_size) == (12, 64, 32)
    assert loaded.config.heads == tuple(range(3, 13))
    assert _same(loaded, model)
    assert _same(load_checkpoint(tmp_path / "release.pth.tar", ema=True), ema)


def test_deit_layout_loads(tmp_path, b16_like):
    model = HydraViT(b16_like)
    torch.save({"model": model.state_dict(), "optimizer": {}, "epoch": 1}, tmp_path / "deit.pth")
    assert _same(load_checkpoint(tmp_path / "deit.pth"), model)


def test_deit_tiny_initialises_the_first_three_heads(tmp_path, b16_like):
    """An independent check of the slicing: the 3-head subnetwork becomes exactly the DeiT-tiny network."""
    torch.manual_seed(2)
    deit_tiny = VisionTransformer(b16_like.narrowed(3))
    deit_tiny.init_weights()
    torch.save({"model": deit_tiny.state_dict()}, tmp_path / "deit_tiny.pth")
    model = HydraViT(b16_like)
    before = model.blocks[0].mlp.fc1.weight[768:].clone()
    assert init_heads_from(model, tmp_path / "deit_tiny.pth") == 3
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x, heads=3) - deit_tiny(x)).abs().max() <= 1e-5
    assert torch.equal(model.blocks[0].mlp.fc1.weight[768:], before)  # the rest keeps its weights


def test_wrong_shape_names_the_first_mismatching_key_and_loads_nothing(tmp_path, digits_model):
    state = dict(digits_model.state_dict())
    state["blocks.1.mlp.fc1.weight"] = torch.zeros(10, 96)
    target = HydraViT.from_preset("digits")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"key 'blocks\.1\.mlp\.fc1\.weight' has shape \(10, 96\), the model expects \(384, 96\)"):
        load_state(target, state, "x.pt")
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_missing_and_unexpected_keys_are_named(tmp_path, digits_model):
    state = dict(digits_model.state_dict())
    del state["norm.bias"]
    with pytest.raises(CheckpointError, match="lacks key 'norm.bias'"):
        load_state(HydraViT.from_preset("digits"), state)
    state = {**digits_model.state_dict(), "dist_token": torch.zeros(1, 1, 96)}
    with pytest.raises(CheckpointError, match="has key 'dist_token'"):
        load_state(HydraViT.from_preset("digits"), state)


def test_non_checkpoint_files_fail_with_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    torch.save({"weights": [1, 2, 3]}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="is not a PyTorch checkpoint"):
        load_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(CheckpointError, match="is not a ViT checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    result = CliRunner().invoke(main, ["eval", "--checkpoint", str(tmp_path / "notes.txt")])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and "notes.txt is not a PyTorch checkpoint" in result.output


def test_narrow_checkpoint_of_wrong_width_is_refused(tmp_path, b16_like):
    bad = VisionTransformer(b16_like.narrowed(2)).state_dict()
    bad["cls_token"] = torch.zeros(1, 1, 100)
    torch.save({"model": bad}, tmp_path / "odd.pth")
    with pytest.raises(CheckpointError, match="width 100 is not a whole number of 64-wide heads"):
        init_heads_from(HydraViT(b16_like), tmp_path / "odd.pth")


def test_state_dict_keys_are_timms_vit_layout():
    """Written out independently of vit.py: the names the official release and timm/DeiT files use."""
    per_block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                 "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                 "mlp.fc2.weight", "mlp.fc2.bias"]
    timm = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight",
            "norm.bias", "head.weight", "head.bias", *(f"blocks.{i}.{n}" for i in range(12) for n in per_block)}
    with torch.device("meta"):
        model = HydraViT.from_preset("b16")
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    assert set(shapes) == timm
    assert shapes["blocks.11.attn.qkv.weight"] == (2304, 768) and shapes["pos_embed"] == (1, 197, 768)
    assert shapes["patch_embed.proj.weight"] == (768, 3, 16, 16) and shapes["head.weight"] == (1000, 768)
