"""bench/transfer.py's parts: the linear probe of a frozen model, the reuse of a kept run, and the report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.train.advice import short_run
from hydra_edge.train.recipe import RECIPES, peak_lr, settings_for

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_transfer", ROOT / "bench" / "transfer.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_transfer"] = bench
spec.loader.exec_module(bench)


@pytest.mark.slow  # trains a small base and probes it (about 40 s)
def test_the_linear_probe_reads_every_head_counts_frozen_features_and_beats_chance(tmp_path):
    torch.manual_seed(0)
    model = HydraViT(preset("digits", heads=(3, 12)))
    model.save(tmp_path / "m.pt", classes=[str(i) for i in range(10)])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = bench.linear_probe(tmp_path / "m.pt", "digits", seed=0)
    assert sorted(probe) == [3, 12] and all(20.0 < acc <= 100.0 for acc in probe.values())  # chance: 10 %
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_kept_run_with_the_same_arguments_is_read_back_not_trained_again(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    args = ["--data", "digits", "--epochs", "1", "--out", str(out)]
    (out / "accuracy.json").write_text(json.dumps({"rows": [{"heads": 3, "top1": 50.0}]}))
    (out / "run.json").write_text(json.dumps({"args": args, "top1": {"3": 50.0}, "seconds": 1.5, "before": ["x"]}))
    assert bench.train(args, tmp_path / "log") == ({3: 50.0}, 1.5, ["x"])


def test_the_report_says_where_fine_tuning_is_ahead_of_scratch_at_every_head_count():
    scratch = {3: 70.0, 12: 80.0}
    bases = [{"base": "weak", "base_epochs": 1, "base_top1": {3: 30.0, 12: 35.0}, "finetuned": {3: 65.0, 12: 82.0},
              "probe": {3: 40.0, 12: 45.0}, "advice": ["warning: base.pt held out only 35.0 %"]},
             {"base": "good", "base_epochs": 6, "base_top1": {3: 80.0, 12: 90.0}, "finetuned": {3: 75.0, 12: 85.0},
              "probe": {3: 60.0, 12: 70.0}, "advice": [], "previous": {3: 20.0, 12: 21.0}}]
    task = {"task": "a -> b", "finetune_epochs": 10, "bases": bases, "scratch": scratch,
            "ahead_everywhere": {b["base"]: all(b["finetuned"][k] > scratch[k] for k in scratch) for b in bases}}
    text = bench.markdown({"host": "cpu", "settings": {"base_epochs": 6, "seed": 0, "finetune": RECIPES["finetune"]},
                           "tasks": [task]})
    assert "| 3 | 70.0 | 65.0 | 40.0 | 75.0 | 60.0 | 20.0 |" in text
    assert "weak base **no**, good base **yes**" in text


def test_the_measured_finetune_defaults_scale_with_the_batch_and_outlast_their_warm_up():
    tuned = settings_for("finetune")
    assert short_run(tuned) is None  # the defaults never end inside their own warm-up
    assert peak_lr(settings_for("finetune", batch_size=64)) == 2 * peak_lr(tuned)


sys.path.insert(0, str(ROOT / "bench"))  # bench/from_scratch.py imports bench/transfer.py as its sibling
scratch_spec = importlib.util.spec_from_file_location("bench_from_scratch", ROOT / "bench" / "from_scratch.py")
from_scratch = importlib.util.module_from_spec(scratch_spec)
scratch_spec.loader.exec_module(from_scratch)


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
    assert "| digits | 11.0 | 21.0 | 16.0 | 2.0 |" in text  # the seeds' mean accuracy and minutes
