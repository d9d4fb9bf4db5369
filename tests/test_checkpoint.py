"""Checkpoints in every supported layout load; bad ones fail with one line and load nothing; a run's
training state and history are written through their schemas and read back as written."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys

from typing import List

import msgspec
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hydra_edge import HydraViT, init_heads_from, load_checkpoint
from hydra_edge.cli import main
from hydra_edge.errors import CheckpointError, HydraEdgeError
from hydra_edge.model.checkpoint import load_state, weights_entry
from hydra_edge.model.config import preset
from hydra_edge.records import codec
from hydra_edge.records.training import Epoch, TrainSettings, history_json, read_resume, training_entry
from hydra_edge.train.data import DataSpec, load_data
from hydra_edge.train.loop import train
from hydra_edge.model.vit import VisionTransformer


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_own_checkpoint_round_trips_with_its_config(tmp_path, digits_model):
    digits_model.save(tmp_path / "m.pt")
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert loaded.config == digits_model.config
    assert _same(loaded, digits_model)


def _release_files(tmp_path, cfg):
    """The plain and EMA weights, and files in the exact layouts that carry them:
    the official HydraViT release (timm's CheckpointSaver: state_dict + state_dict_ema, argparse args,
    a DDP 'module.' prefix), DeiT's (model + model_ema) and a timm run without EMA (state_dict only)."""
    torch.manual_seed(1)
    plain, ema = HydraViT(cfg), HydraViT(cfg)
    args = argparse.Namespace(lr=5e-4, model_ema=True)
    files = {
        "release": {"epoch": 299, "arch": "hydravit_dyn_patch16_224", "args": args,
                    "state_dict": {f"module.{k}": v for k, v in plain.state_dict().items()},
                    "optimizer": {}, "version": 2, "state_dict_ema": ema.state_dict(), "metric": 80.6},
        "deit": {"model": plain.state_dict(), "optimizer": {}, "lr_scheduler": {}, "epoch": 299,
                 "model_ema": ema.state_dict(), "scaler": {}, "args": args},
        "timm": {"epoch": 9, "arch": "vit_base_patch16_224", "args": args, "state_dict": plain.state_dict(),
                 "version": 2},
    }
    for name, obj in files.items():
        torch.save(obj, tmp_path / f"{name}.pth.tar")
    return plain, ema


@pytest.mark.parametrize("layout, entry", [("release", "state_dict_ema"), ("deit", "model_ema")])
def test_ema_weights_are_loaded_when_present_and_no_ema_loads_the_plain_ones(tmp_path, b16_like, layout, entry):
    plain, ema = _release_files(tmp_path, b16_like)
    path = tmp_path / f"{layout}.pth.tar"
    loaded = load_checkpoint(path)
    assert (loaded.config.num_heads, loaded.config.head_dim, loaded.config.img_size) == (12, 64, 32)
    assert loaded.config.heads == tuple(range(3, 13))
    assert _same(loaded, ema) and not _same(loaded, plain)
    assert _same(load_checkpoint(path, ema=False), plain)
    obj = torch.load(path, weights_only=False)
    assert weights_entry(obj) == entry and weights_entry(obj, ema=False) in ("state_dict", "model")


@pytest.mark.slow  # trains through the command
def test_a_file_without_ema_weights_falls_back_to_its_plain_weights_with_a_note(tmp_path, b16_like, caplog,
                                                                                   digits_model):
    plain, _ = _release_files(tmp_path, b16_like)
    with caplog.at_level(logging.WARNING, logger="hydra_edge.model.checkpoint"):
        assert _same(load_checkpoint(tmp_path / "timm.pth.tar"), plain)
    assert [r.getMessage() for r in caplog.records] == [
        f"note: {tmp_path / 'timm.pth.tar'} has no EMA weights (state_dict_ema or model_ema); "
        "loading its 'state_dict' weights"]
    caplog.clear()
    digits_model.save(tmp_path / "own.pt")  # hydra-edge's own files never hold EMA weights: no note
    with caplog.at_level(logging.WARNING, logger="hydra_edge.model.checkpoint"):
        load_checkpoint(tmp_path / "own.pt")
        load_checkpoint(tmp_path / "timm.pth.tar", ema=False)
    assert caplog.records == []
    # what a user sees: the note on stderr, in one line, from the real command
    proc = subprocess.run([sys.executable, "-m", "hydra_edge.cli", "info", "--checkpoint",
                           str(tmp_path / "timm.pth.tar")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"note: {tmp_path / 'timm.pth.tar'} has no EMA weights (state_dict_ema or " \
                                  "model_ema); loading its 'state_dict' weights"


@pytest.mark.parametrize("broken, message", [
    ("not weights", r"'state_dict_ema' holds a str without tensors, not a state dict; pass --no-ema"),
    ({}, r"'state_dict_ema' holds a dict without tensors, not a state dict; pass --no-ema"),
    ("missing", r"\['state_dict_ema'\] lacks key 'norm.bias'"),
    ("misshapen", r"\['state_dict_ema'\]: key 'head.weight' has shape \(10, 7\), the model expects \(10, 768\)"),
])
def test_a_broken_ema_entry_fails_in_one_line_and_no_ema_still_loads(tmp_path, b16_like, broken, message):
    plain, ema = _release_files(tmp_path, b16_like)
    obj = torch.load(tmp_path / "release.pth.tar", weights_only=False)
    state = dict(ema.state_dict())
    if broken == "missing":
        del state["norm.bias"]
        broken = state
    elif broken == "misshapen":
        state["head.weight"] = torch.zeros(10, 7)
        broken = state
    obj["state_dict_ema"] = broken
    torch.save(obj, tmp_path / "broken.pth.tar")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "broken.pth.tar")
    assert _same(load_checkpoint(tmp_path / "broken.pth.tar", ema=False), plain)
    result = CliRunner().invoke(main, ["info", "--checkpoint", str(tmp_path / "broken.pth.tar")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert CliRunner().invoke(main, ["info", "--checkpoint", str(tmp_path / "broken.pth.tar"), "--no-ema"]).exit_code == 0


def test_eval_and_init_take_ema_or_plain_weights_as_asked(tmp_path, b16_like):
    """``eval`` records which weights it evaluated; ``train --init`` copies the ones asked for."""
    from PIL import Image

    plain, ema = _release_files(tmp_path, b16_like)
    rng = np.random.default_rng(0)
    for c in range(10):
        (tmp_path / "images" / f"c{c}").mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(tmp_path / "images" / f"c{c}" / f"{i}.png")
    for flag, weights in (([], "state_dict_ema"), (["--no-ema"], "state_dict")):
        out = tmp_path / f"eval-{weights}"
        result = CliRunner().invoke(main, ["eval", "--checkpoint", str(tmp_path / "release.pth.tar"), "--data",
                                           str(tmp_path / "images"), "--heads", "3,12", "--out", str(out), *flag])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "eval.json").read_text())["weights"] == weights
    narrow = b16_like.narrowed(3)
    torch.manual_seed(3)
    tiny_plain, tiny_ema = VisionTransformer(narrow), VisionTransformer(narrow)
    torch.save({"model": tiny_plain.state_dict(), "model_ema": tiny_ema.state_dict()}, tmp_path / "deit_tiny.pth")
    x = torch.randn(2, 3, 32, 32)
    for ema_flag, tiny in ((True, tiny_ema), (False, tiny_plain)):
        model = HydraViT(b16_like)
        assert init_heads_from(model, tmp_path / "deit_tiny.pth", ema=ema_flag) == 3
        with torch.no_grad():
            assert (model(x, heads=3) - tiny(x)).abs().max() <= 1e-5


def test_the_manifest_records_which_weights_were_converted(tmp_path, b16_like):
    """convert resolves the weights once; every job loads those, and switching re-converts."""
    from hydra_edge.convert.inputs import check_inputs
    from hydra_edge.convert.options import ConvertOptions
    from hydra_edge.convert.plan import plan

    _release_files(tmp_path, b16_like)
    planned = {}
    for ema in (True, False):
        opts = ConvertOptions(checkpoint=tmp_path / "release.pth.tar", target="jetson", out=tmp_path / "b",
                              heads="3", ema=ema)
        planned[ema] = plan(opts, check_inputs(opts))
    assert planned[True].manifest.checkpoint["weights"] == "state_dict_ema"
    assert planned[False].manifest.checkpoint["weights"] == "state_dict"
    assert all(job.ema for job in planned[True].jobs) and not any(job.ema for job in planned[False].jobs)
    assert {j.fingerprint for j in planned[True].jobs}.isdisjoint(j.fingerprint for j in planned[False].jobs)


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


def _equal(a, b) -> bool:
    """Equal as stored data: tensors element for element, containers item for item."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def test_a_runs_training_state_and_history_read_back_through_their_schemas_unchanged(tmp_path):
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 12)))
    spec = DataSpec("digits", seed=3, val_fraction=0.25)
    train(model, load_data(spec, model.config), TrainSettings(epochs=2, warmup_epochs=1, batch_size=256,
                                                              ema_decay=0.9), tmp_path)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    resume = read_resume(saved, "checkpoint.pt")
    assert resume.data == spec  # the checkpoint's data record is the spec the run was given
    state = resume.train
    assert state.epoch == 2 and state.ema_updates > 0 and state.settings.ema_decay == 0.9
    assert _equal(training_entry("checkpoint.pt", **msgspec.structs.asdict(state)), saved["train"])
    written = (tmp_path / "history.json").read_bytes()
    history = codec.decode(written, List[Epoch], "history.json", "what", "hint")
    assert [h.epoch for h in history] == [1, 2] and history == state.history
    assert history_json(history, "history.json") == written  # byte for byte


def test_a_checkpoint_from_before_settings_and_ema_were_kept_reads_and_writes_back_as_it_was():
    old = {"epoch": 1,
           "optimizer": {"state": {}, "param_groups": [{"lr": 0.003, "weight_decay": 0.05, "params": [0, 1]}]},
           "schedule": {"last_epoch": 56, "base_lrs": [0.003], "lr_lambdas": [None]},
           "history": [{"epoch": 1, "loss": 1.9, "lr": 0.0015, "drawn": {3: 30, 12: 26},
                        "val_top1": {3: 41.5, 12: 48.0}, "world_size": 1}]}
    state = read_resume({"train": old}, "old.pt").train
    assert state.settings is None and state.ema_updates == 0 and state.history[0].val_top1_ema is None
    assert training_entry("old.pt", **msgspec.structs.asdict(state)) == old
    assert json.loads(history_json(state.history, "history.json")) == \
        [{**old["history"][0], "drawn": {"3": 30, "12": 26}, "val_top1": {"3": 41.5, "12": 48.0}}]


def test_a_training_state_that_would_not_resume_is_never_written():
    history = [{"epoch": 1, "loss": float("nan"), "lr": 0.001, "drawn": {3: 1}, "val_top1": {3: 10.0}, "world_size": 1}]
    with pytest.raises(HydraEdgeError, match=r"run.pt \['train'\]: \$\.history\[0\]\.loss: nan is not a finite number"):
        training_entry("run.pt ['train']", epoch=1, optimizer={"state": {}, "param_groups": []},
                       schedule={"last_epoch": 1, "base_lrs": [0.001], "lr_lambdas": [None]}, history=history)


def test_a_data_spec_built_in_code_checks_its_held_out_share_as_the_schema_does():
    assert DataSpec.from_dict(DataSpec("photos", seed=4, val_fraction=0.1).to_dict()) == DataSpec("photos", 4, 0.1)
    for bad in (0, 1, 1.5, float("nan"), True, "0.2"):
        with pytest.raises(HydraEdgeError, match="held-out fraction"):
            DataSpec("digits", val_fraction=bad)
