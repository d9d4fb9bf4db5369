"""bench/transfer.py's parts: the linear probe of a frozen model, the pixel baseline, the reuse of a kept run, the
report over seeds, and the evidence train's advice cites."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import from_scratch
from bench import transfer as bench
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.train.advice import short_run
from hydra_edge.train.recipe import RECIPES, peak_lr, settings_for

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # trains a small base and probes it (about 40 s)
def test_the_linear_probe_reads_every_head_counts_frozen_features_and_beats_chance(tmp_path):
    torch.manual_seed(0)
    model = HydraViT(preset("digits", heads=(3, 12)))
    model.save(tmp_path / "m.pt", classes=[str(i) for i in range(10)])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = bench.linear_probe(tmp_path / "m.pt", "digits", seed=0)
    assert sorted(probe) == [3, 12] and all(20.0 < acc <= 100.0 for acc in probe.values())  # chance: 10 %
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_pixel_baseline_fits_the_raw_pixels_at_their_own_size_on_the_runs_split(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, level in enumerate((40, 200)):  # two classes a linear model tells apart at 25 px, as lfw_subset's
        (tmp_path / f"c{c}").mkdir()
        for i in range(20):
            Image.fromarray(np.clip(level + rng.normal(0, 30, (25, 25)), 0, 255).astype(np.uint8)).save(
                tmp_path / f"c{c}" / f"{i}.png")
    assert bench.linear_pixels(str(tmp_path), seed=0) == 100.0
    assert 90.0 < bench.linear_pixels("digits", seed=0) <= 100.0  # scikit-learn's 8x8 digits: about 97 %


def test_a_kept_run_with_the_same_arguments_is_read_back_not_trained_again(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    args = ["--data", "digits", "--epochs", "1", "--out", str(out)]
    (out / "accuracy.json").write_text(json.dumps({"rows": [{"heads": 3, "top1": 50.0}]}))
    (out / "run.json").write_text(json.dumps({"args": args, "top1": {"3": 50.0}, "seconds": 1.5, "before": ["x"]}))
    assert bench.train(args, tmp_path / "log") == ({3: 50.0}, 1.5, ["x"])


def _run(seed: int, scratch: dict, weak: dict, good: dict, pixels: float) -> dict:
    """One seed's results of a task: a weak base (35 % at best on 10 classes) and a good one (90 %)."""
    return {"seed": seed, "scratch": scratch, "pixels": pixels, "bases": [
        {"base": "weak", "base_epochs": 1, "base_top1": {3: 30.0, 12: 35.0}, "finetuned": weak,
         "probe": {3: 40.0, 12: 45.0}, "advice": []},
        {"base": "good", "base_epochs": 6, "base_top1": {3: 80.0, 12: 90.0}, "finetuned": good,
         "probe": {3: 60.0, 12: 70.0}, "advice": [], "previous": {3: 20.0, 12: 21.0}}]}


def test_the_report_gives_the_seeds_mean_and_range_the_pixel_baseline_and_the_advice_evidence():
    runs = [_run(0, {3: 70.0, 12: 80.0}, {3: 65.0, 12: 82.0}, {3: 75.0, 12: 85.0}, 95.0),
            _run(1, {3: 60.0, 12: 70.0}, {3: 66.0, 12: 72.0}, {3: 77.0, 12: 87.0}, 97.5)]
    report = {"host": "cpu", "settings": {"base_epochs": 6, "seeds": [0, 1], "finetune": RECIPES["finetune"]},
              "tasks": [{"task": "a -> b", "base_classes": 10, "finetune_epochs": 10, "runs": runs}]}
    text = bench.markdown(report)
    assert "| heads | from scratch | pixels, logistic | weak base: fine-tuned | weak base: probe |" in text
    assert "| 3 | 65.0 (60.0-70.0) | 96.2 (95.0-97.5) | 65.5 (65.0-66.0) | 40.0 (40.0-40.0) |" in text
    # weak: behind on the mean with seed 0 (73.5 < 75), ahead with seed 1; ahead at every head count only with seed 1
    assert "weak base in 1 of 2 seeds, good base in 2 of 2 seeds; at every head count: weak base in 1 of 2" in text
    assert bench.evidence(report, 0.5) == {True: (1, 2), False: (2, 2)}
    assert "in 1 of 2 runs from bases under 50% of the way" in text and "in 2 of 2 from bases above it" in text


def test_the_advice_cites_what_the_committed_bench_results_measured():
    """The counts train prints are the ones bench/results/transfer.json holds, not typed in apart from them."""
    from hydra_edge.train import advice

    report = json.loads((ROOT / "bench" / "results" / "transfer.json").read_text())  # (keys read as text: unused)
    assert bench.evidence(report, advice.WEAK_SHARE) == advice.MEASURED_AHEAD


def test_the_measured_finetune_defaults_scale_with_the_batch_and_outlast_their_warm_up():
    tuned = settings_for("finetune")
    assert short_run(tuned) is None  # the defaults never end inside their own warm-up
    assert peak_lr(settings_for("finetune", batch_size=64)) == 2 * peak_lr(tuned)




def test_from_scratch_trains_mini_per_set_recipe_and_seed_through_the_command_and_averages_the_seeds(tmp_path,
                                                                                                  monkeypatch):
    calls = []

    def fake_train(args, log):
        calls.append(args)
        seed = int(args[args.index("--seed") + 1])
        return {3: 10.0 + seed, 12: 20.0 + seed}, 60.0 * (seed + 1), []

    monkeypatch.setattr(from_scratch, "train", fake_train)
    entries = from_scratch.measure(["mnist", "digits"], ["digits", "scratch"], 3, [0, 2], tmp_path, tmp_path / "log")
    assert len(calls) == 8 and all(a[a.index("--preset") + 1] == "mini" and "--epochs" in a for a in calls)
    assert [a[a.index("--data") + 1] for a in calls[::4]] == ["mnist", str(tmp_path / "digits-folder")]
    assert sum(1 for _ in (tmp_path / "digits-folder").rglob("*.png")) == 1797  # scikit-learn's digits, all of them
    assert [(e["set"], e["recipe"]) for e in entries] == [("mnist", "digits"), ("mnist", "scratch"),
                                                          ("digits", "digits"), ("digits", "scratch")]
    assert entries[0]["top1"] == {3: 11.0, 12: 21.0} and entries[0]["seconds"] == [60.0, 180.0]

    report = {"host": "cpu", "settings": {"epochs": 3, "seeds": [0, 2], "sets": ["mnist", "digits"],
                                          "recipes": ["digits", "scratch"]}, "entries": entries}
    text = from_scratch.markdown(report)
    assert "| recipe | 3 | 12 | mean | minutes per run |" in text
    assert "| digits | 11.0 (10.0-12.0) | 21.0 (20.0-22.0) | 16.0 (15.0-17.0) | 2.0 |" in text  # mean (range), minutes


def test_a_probe_is_read_back_only_for_the_same_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --work run again reuses a base's probe; a base retrained into its folder (other --base-epochs) is
    probed again, never reported with the old base's probe."""
    calls = []
    monkeypatch.setattr(bench, "linear_probe",
                        lambda checkpoint, data, seed: calls.append(data) or {3: float(len(calls))})
    (tmp_path / "checkpoint.pt").write_bytes(b"one base")
    assert bench.kept_probe(tmp_path, "/data/digits", 0) == {3: 1.0}
    assert bench.kept_probe(tmp_path, "/data/digits", 0) == {3: 1.0} and len(calls) == 1
    (tmp_path / "checkpoint.pt").write_bytes(b"the base trained longer")
    assert bench.kept_probe(tmp_path, "/data/digits", 0) == {3: 2.0} and len(calls) == 2
