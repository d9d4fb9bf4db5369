"""The training recipe: each part wired into the loop (augmentations, mixup/cutmix soft targets, EMA,
clipping, layer decay, accumulation, precision), exact resume with all of them, and their bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import Subset

import hydra_edge.train.loop as loop
import hydra_edge.train.recipe as recipe
from hydra_edge import HydraViT, load_checkpoint
from hydra_edge.cli import main
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.records.training import TrainSettings
from hydra_edge.train.augment import SoftTargets, TrainingTransform, training_reads
from hydra_edge.train.data import DataSpec, load_data
from hydra_edge.train.loop import CHECKPOINT, train
from hydra_edge.train.recipe import RECIPES, default_recipe, layer_of, param_groups, settings_for

# Every part of the recipe at once, on a model that trains an epoch of digits in about a second.
EVERYTHING = dict(epochs=2, batch_size=128, lr=2e-3, warmup_epochs=1, mixup=0.8, cutmix=1.0, rand_augment=5,
                  random_erasing=0.25, crop_scale=0.5, drop_path=0.1, ema_decay=0.9, clip_grad=1.0,
                  layer_decay=0.75, decay_all=False, label_smoothing=0.1, accum_steps=2)


def _tiny(**overrides) -> HydraViT:
    torch.manual_seed(0)
    return HydraViT(preset("digits", depth=1, heads=(3, 12), **overrides))


def _digits(model: HydraViT, **spec):
    return load_data(DataSpec("digits", **spec), model.config)


def _images(root: Path, classes: int = 3, per_class: int = 6) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = (np.linspace(0, 255, 24 * 20 * 3).reshape(24, 20, 3) * (c + 1) / 3
                      + rng.integers(0, 30, (24, 20, 3))).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{i}.png")
    return root


def test_recipes_are_settings_the_typed_values_win_over_and_the_digits_recipe_is_the_defaults():
    assert settings_for("digits") == TrainSettings()  # old checkpoints resume with what they trained with
    imagenet = settings_for("imagenet", epochs=2, mixup=0.0)
    assert (imagenet.epochs, imagenet.mixup, imagenet.cutmix, imagenet.recipe) == (2, 0.0, 1.0, "imagenet")
    for name, values in RECIPES.items():  # every recipe passes the schema a checkpoint is read with
        settings = settings_for(name)
        assert msgspec.convert(msgspec.to_builtins(settings), TrainSettings) == settings
        assert all(getattr(settings, k) == v for k, v in values.items())
    with pytest.raises(HydraEdgeError, match="unknown recipe 'deit'; choose one of digits, finetune, scratch, "):
        settings_for("deit")


def test_without_a_recipe_new_weights_of_a_larger_preset_get_scratch_and_a_folder_from_a_checkpoint_finetune():
    assert default_recipe("photos", None, pretrained=True) == "finetune"
    assert default_recipe("mnist", None, pretrained=True) == "digits"  # built-in data, as before
    for data, preset_name in (("digits", None), ("mnist", None), ("mnist", "digits"), ("photos", "digits")):
        assert default_recipe(data, preset_name, pretrained=False) == "digits"  # the demo's, and its figures'
    for data, preset_name in (("mnist", "mini"), ("photos", "mini"), ("photos", None), ("photos", "b16")):
        assert default_recipe(data, preset_name, pretrained=False) == "scratch"


def test_a_folder_trained_on_mini_from_new_weights_gets_the_scratch_recipe(tmp_path):
    result = CliRunner().invoke(main, ["train", "--data", str(_images(tmp_path / "images")), "--preset", "mini",
                                       "--heads", "3,12", "--epochs", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "recipe scratch" in result.output
    settings = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)["train"]["settings"]
    assert {k: settings[k] for k in RECIPES["scratch"]} == {**RECIPES["scratch"], "epochs": 2}


@pytest.mark.parametrize("mixup, cutmix", [(0.8, 0.0), (0.0, 1.0)])
def test_mixup_and_cutmix_make_probability_targets_in_the_share_the_pixels_were_mixed(mixup, cutmix):
    torch.manual_seed(0)
    x = torch.rand(32, 3, 16, 16)
    y = torch.arange(32)  # one class per image, so a target names both images it was mixed from
    mixed, target = SoftTargets(mixup, cutmix, classes=32)(x, y)
    assert target.shape == (32, 32) and torch.allclose(target.sum(1), torch.ones(32))
    assert (target > 0).sum(1).max() == 2 and not torch.equal(mixed, x)
    for i in range(32):
        other = [j for j in torch.nonzero(target[i]).flatten().tolist() if j != i]
        if not other:  # paired with itself
            continue
        j, share = other[0], target[i, other[0]]
        if mixup:
            assert torch.allclose(mixed[i], (1 - share) * x[i] + share * x[j], atol=1e-6)
        else:  # cutmix: the share of the pixels pasted from the other image
            pasted = (mixed[i] == x[j]).all(0).float().mean()
            assert torch.isclose(pasted, share, atol=1e-6), (pasted, share)


def test_with_mixup_and_cutmix_each_batch_uses_one_of_the_two():
    torch.manual_seed(0)
    x, y = torch.rand(32, 3, 16, 16), torch.arange(32)
    cut = 0
    for _ in range(20):
        mixed, _ = SoftTargets(0.8, 1.0, classes=32)(x, y)
        cut += bool(((mixed == x).all(1).float().mean() > 0.05).item())  # cutmix keeps whole pixels
    assert 3 <= cut <= 17
    assert SoftTargets(0.0, 0.0, classes=5).active is False


def test_the_loop_trains_on_soft_targets_under_mixup_and_on_class_ids_without(tmp_path, monkeypatch):
    seen = []
    real = torch.nn.functional.cross_entropy

    def spy(logits, target, **kwargs):
        seen.append((target.dtype, tuple(target.shape), kwargs.get("label_smoothing")))
        return real(logits, target, **kwargs)

    monkeypatch.setattr(loop.F, "cross_entropy", spy)
    model = _tiny()
    train(model, _digits(model), settings_for("digits", epochs=1, batch_size=256, mixup=0.8), tmp_path / "mix")
    assert {s for s in seen} == {(torch.float32, (256, 10), 0.1)}
    seen.clear()
    train(_tiny(), _digits(model), settings_for("digits", epochs=1, batch_size=256), tmp_path / "plain")
    assert {s for s in seen} == {(torch.int64, (256,), 0.1)}


def test_two_reads_of_a_training_image_differ_and_two_evaluation_reads_are_equal(tmp_path):
    folder = _images(tmp_path / "images")
    cfg = preset("digits", img_size=16, patch_size=4, in_chans=3, num_classes=3)
    split = load_data(DataSpec(str(folder)), cfg)
    settings = settings_for("imagenet")  # a random crop, flips and RandAugment
    reads = training_reads(split.train, cfg, settings)
    transform = TrainingTransform(settings, cfg, classes=3)
    x, y = reads[0]
    assert x.shape[-1] > cfg.img_size  # read larger; the random crop cuts it to the model's size
    torch.manual_seed(0)
    first, second = (transform(x[None], torch.tensor([y]))[0] for _ in range(2))
    assert first.shape == (1, 3, cfg.img_size, cfg.img_size) and not torch.equal(first, second)
    assert torch.equal(split.val[0][0], split.val[0][0])
    plain = TrainingTransform(settings_for("digits"), cfg, classes=3)
    assert not plain.active and plain(split.train[0][0][None], torch.tensor([0]))[0].equal(split.train[0][0][None])


def test_layer_decay_scales_each_layers_lr_and_keeps_decay_off_biases_norms_and_embeddings():
    model = _tiny()
    depth = model.config.depth
    groups = param_groups(model, settings_for("digits", layer_decay=0.5, decay_all=False), lr=1.0)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sum(len(g["params"]) for g in groups) == len(names)
    for g in groups:
        for p in g["params"]:
            name = names[id(p)]
            assert g["lr_scale"] == g["lr"] == 0.5 ** (depth + 1 - layer_of(name, depth)), name
            exempt = p.ndim <= 1 or name in ("cls_token", "pos_embed")
            assert g["weight_decay"] == (0.0 if exempt else 0.05), name
    assert {layer_of(n, depth) for n in names.values()} == set(range(depth + 2))
    assert layer_of("patch_embed.proj.weight", 12) == 0 and layer_of("blocks.3.mlp.fc1.weight", 12) == 4
    assert layer_of("head.weight", 12) == layer_of("norm.bias", 12) == layer_of("heads.3.weight", 12) == 13
    assert len(param_groups(model, TrainSettings(), lr=1.0)) == 1  # the digits recipe: one group, as before


def _count_steps(monkeypatch) -> dict[str, int]:
    counts = {"forward": 0, "step": 0}
    forward, step = HydraViT.forward, torch.optim.AdamW.step

    def counted_forward(self, *args, **kwargs):
        counts["forward"] += self.training
        return forward(self, *args, **kwargs)

    def counted_step(self, *args, **kwargs):
        counts["step"] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(HydraViT, "forward", counted_forward)
    monkeypatch.setattr(torch.optim.AdamW, "step", counted_step)
    return counts


def test_accumulation_takes_n_micro_batches_per_step_and_equals_one_larger_batch(tmp_path, monkeypatch):
    model = _tiny()
    data = _digits(model)
    counts = _count_steps(monkeypatch)
    accumulated = _tiny()
    train(accumulated, data, settings_for("digits", epochs=1, batch_size=64, accum_steps=3), tmp_path / "a")
    steps = (len(data.train) // 64) // 3
    assert counts == {"forward": 3 * steps, "step": steps}
    history = json.loads((tmp_path / "a" / "history.json").read_text())
    assert sum(history[0]["drawn"].values()) == steps  # one head count per optimizer step

    one = _tiny()
    train(one, data, settings_for("digits", epochs=1, batch_size=128), tmp_path / "one")
    two = _tiny()
    train(two, data, settings_for("digits", epochs=1, batch_size=64, accum_steps=2), tmp_path / "two")
    x = torch.stack([data.val[i][0] for i in range(64)])
    with torch.no_grad():  # the outputs, not every weight: Adam turns the keys' bias (whose gradient is
        for k in (3, 12):  # rounding noise, softmax ignores it) into steps of size lr either way
            assert torch.allclose(one.eval()(x, heads=k), two.eval()(x, heads=k), atol=1e-4), k


def test_clipping_bounds_the_gradient_norm_each_step(tmp_path, monkeypatch):
    norms: list[float] = []
    step = torch.optim.AdamW.step

    def measured(self, *args, **kwargs):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", measured)
    model = _tiny()
    train(model, _digits(model), settings_for("digits", epochs=1, batch_size=128), tmp_path / "free")
    assert max(norms) > 0.05  # the bound below does bite
    norms.clear()
    train(_tiny(), _digits(model), settings_for("digits", epochs=1, batch_size=128, clip_grad=0.05), tmp_path / "clip")
    assert norms and max(norms) <= 0.05 * (1 + 1e-4)


def test_ema_weights_are_updated_saved_as_state_dict_ema_and_loaded_by_default(tmp_path):
    model = _tiny()
    settings = settings_for("digits", epochs=2, batch_size=128, ema_decay=0.9, drop_path=0.1)
    result = train(model, _digits(model), settings, tmp_path)
    assert model.drop_path_rate == 0.1
    saved = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    plain, ema = saved["state_dict"], saved["state_dict_ema"]
    assert plain.keys() == ema.keys() and any(not torch.equal(plain[n], ema[n]) for n in plain)
    start = _tiny().state_dict()
    assert any(not torch.equal(start[n], ema[n]) for n in ema)  # it moved with training
    assert saved["train"]["ema_updates"] == 2 * (len(_digits(model).train) // 128)
    assert saved["classes"] == [str(d) for d in range(10)]
    by_default, without = load_checkpoint(tmp_path / CHECKPOINT), load_checkpoint(tmp_path / CHECKPOINT, ema=False)
    assert all(torch.equal(by_default.state_dict()[n], ema[n]) for n in ema)
    assert all(torch.equal(without.state_dict()[n], plain[n]) for n in plain)
    history = json.loads((tmp_path / "history.json").read_text())
    assert all(h["val_top1_ema"].keys() == h["val_top1"].keys() for h in history)
    assert result.weights == "state_dict_ema" and result.accuracy == {int(k): v for k, v in
                                                                      history[-1]["val_top1_ema"].items()}
    assert json.loads((tmp_path / "accuracy.json").read_text())["weights"] == "state_dict_ema"


def test_bf16_autocast_runs_on_the_cpu(tmp_path, monkeypatch):
    dtypes = set()
    real = torch.nn.functional.cross_entropy

    def spy(logits, target, **kwargs):
        dtypes.add(logits.dtype)
        return real(logits, target, **kwargs)

    monkeypatch.setattr(loop.F, "cross_entropy", spy)
    monkeypatch.setattr(recipe, "cpu_has_bf16", lambda: True)  # emulated where the CPU lacks it: slower, same path
    model = _tiny()
    result = train(model, _digits(model), settings_for("digits", epochs=1, batch_size=256, precision="bf16"), tmp_path)
    assert dtypes == {torch.bfloat16} and set(result.accuracy) == {3, 12}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast: fp32 weights, bf16 compute


def _straight_and_resumed(tmp_path, monkeypatch, data, settings, evaluations_before_stop: int):
    """Two runs' checkpoints: one straight through, one stopped (Ctrl-C) in epoch 2's evaluation, after
    ``evaluations_before_stop`` evaluations, then resumed from its epoch-1 checkpoint."""
    train(_tiny(), data, settings, tmp_path / "straight")
    real, calls = loop.right_per_heads, {"n": 0}

    def stop_in_epoch_2(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > evaluations_before_stop:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "right_per_heads", stop_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(_tiny(), data, settings, tmp_path / "resumed")
    monkeypatch.setattr(loop, "right_per_heads", real)
    assert torch.load(tmp_path / "resumed" / CHECKPOINT, weights_only=True)["train"]["epoch"] == 1
    train(HydraViT(preset("digits", depth=1, heads=(3, 12))), data, settings, tmp_path / "resumed", resume=True)
    return (torch.load(tmp_path / run / CHECKPOINT, weights_only=True) for run in ("straight", "resumed"))


@pytest.mark.slow  # trains, stops and resumes a run
def test_an_interrupted_run_with_every_recipe_part_resumes_to_the_same_weights_ema_and_schedule(tmp_path, monkeypatch):
    model = _tiny()
    data = _digits(model)
    settings = settings_for("digits", **EVERYTHING)
    a, b = _straight_and_resumed(tmp_path, monkeypatch, data, settings, evaluations_before_stop=2)  # plain + EMA
    for entry in ("state_dict", "state_dict_ema"):
        for name in a[entry]:
            assert torch.equal(a[entry][name], b[entry][name]), (entry, name)
    assert a["train"]["schedule"] == b["train"]["schedule"] and a["train"]["ema_updates"] == b["train"]["ema_updates"]
    assert [h["loss"] for h in a["train"]["history"]] == [h["loss"] for h in b["train"]["history"]]


@pytest.mark.slow  # trains, stops and resumes a run
def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path, monkeypatch):
    """fp16 is refused on a CPU; the CPU's fp16 autocast stands in for a GPU's here, so the GradScaler path runs."""
    monkeypatch.setattr(loop, "autocast_dtype", lambda precision, device: torch.float16)
    model = _tiny()
    full = _digits(model)  # a few steps: fp16 matmuls are slow on a CPU
    data = replace(full, train=Subset(full.train, range(256)), val=Subset(full.val, range(64)))
    settings = settings_for("digits", epochs=2, batch_size=128, clip_grad=1.0)
    a, b = _straight_and_resumed(tmp_path, monkeypatch, data, settings, evaluations_before_stop=1)
    steps = 2 * (256 // 128)
    assert a["train"]["scaler"] == b["train"]["scaler"] and a["train"]["scaler"]["_growth_tracker"] == steps
    assert all(torch.equal(a["state_dict"][n], b["state_dict"][n]) for n in a["state_dict"])


def test_a_checkpoint_from_before_the_recipe_fields_still_resumes(tmp_path):
    model = _tiny()
    train(model, _digits(model), settings_for("digits", epochs=1, batch_size=256), tmp_path)
    saved = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    old = {"epochs", "batch_size", "lr", "weight_decay", "warmup_epochs", "label_smoothing", "weights", "seed",
           "head_sampling", "init_scheme"}
    saved["train"]["settings"] = {k: v for k, v in saved["train"]["settings"].items() if k in old}
    saved["train"]["settings"]["epochs"] = 2
    del saved["classes"]
    torch.save(saved, tmp_path / CHECKPOINT)
    result = CliRunner().invoke(main, ["train", "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 0, result.output
    settings = torch.load(tmp_path / CHECKPOINT, weights_only=True)["train"]["settings"]
    assert settings["recipe"] == "digits" and settings["epochs"] == 2


@pytest.mark.slow  # torch.compile builds a graph per head count and its backward on the CPU: about a minute
def test_a_compiled_model_trains_as_the_eager_one(tmp_path):
    model = _tiny()
    data = _digits(model)
    train(_tiny(), data, settings_for("digits", epochs=1, batch_size=256), tmp_path / "eager")
    train(_tiny(), data, settings_for("digits", epochs=1, batch_size=256, compile=True), tmp_path / "compiled")
    eager, compiled = (json.loads((tmp_path / run / "history.json").read_text())[0] for run in ("eager", "compiled"))
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-3) and compiled["drawn"] == eager["drawn"]
    saved = torch.load(tmp_path / "compiled" / CHECKPOINT, weights_only=True)["state_dict"]
    assert saved.keys() == model.state_dict().keys()  # the model's own keys, no compile wrapper's


def test_threads_default_to_one_for_a_small_model_and_to_the_free_cores_for_a_large_one(monkeypatch):
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(loop.os, "getloadavg", lambda: (3.2, 1.0, 1.0))
    assert loop.cpu_threads(preset("digits"), 32) == 1
    assert loop.cpu_threads(preset("b16"), 32) == 5
    monkeypatch.setattr(loop.os, "getloadavg", lambda: (20.0, 1.0, 1.0))
    assert loop.cpu_threads(preset("b16"), 32) == 1


@pytest.mark.parametrize("args, message", [
    (["--recipe", "deit"], "unknown recipe 'deit'; choose one of digits, finetune, scratch, imagenet"),
    (["--precision", "fp16"], "--precision fp16 needs a CUDA GPU"),
    (["--precision", "bf16"], "--precision bf16: this CPU has no native bf16"),
])
def test_a_recipe_or_precision_this_machine_cannot_run_is_one_line_and_writes_nothing(tmp_path, monkeypatch,
                                                                                     args, message):
    monkeypatch.setattr(recipe, "cpu_has_bf16", lambda: False)
    result = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), "--epochs", "1", *args])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_train_help_and_the_docs_table_come_from_the_one_settings_schema():
    """SETTINGS_HELP is the one text for each setting: every option's help, and docs/training.md's table."""
    from hydra_edge.records.training import SETTINGS_HELP, TrainSettings, setting_flag, settings_table

    no_option = {"weights", "workers", "init_scheme", "recipe"}  # a text list, the machine's, and pickers
    assert set(SETTINGS_HELP) == set(TrainSettings.__struct_fields__) - no_option
    result = CliRunner().invoke(main, ["train", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    helptext = " ".join(result.output.split())
    for name, text in SETTINGS_HELP.items():
        assert all(f"{flag} " in helptext for flag in setting_flag(name).split("/")), name
        assert " ".join(text.split()) in helptext, name
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    begin = docs.index("<!-- settings table: generated by hydra_edge.records.training.settings_table() -->\n")
    end = docs.index("<!-- end of settings table -->")
    assert docs[docs.index("\n", begin) + 1:end] == settings_table()
    assert settings_table().count("\n| `--") == len(SETTINGS_HELP)
