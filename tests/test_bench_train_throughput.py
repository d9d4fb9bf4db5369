"""bench/train_throughput.py on the digits preset: both sides timed and measured in one run, per precision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = str(ROOT / "bench" / "train_throughput.py")


@pytest.mark.slow  # runs the bench end to end: transformers' ViT beside ours, two precisions, a PNG
def test_the_bench_compares_the_sliced_model_with_a_dense_one_per_precision_and_head_count(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, BENCH, "--device", "cpu", "--preset", "digits", "--batch", "4",
                           "--steps", "1", "--mix-steps", "3", "--heads", "3,12,mix", "--threads", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "train_throughput.json").read_text())
    assert report["device"] == "cpu" and report["threads"] == 1 and "sdpa" in report["dense_reference"]
    assert [(r["precision"], r["heads"]) for r in report["rows"]] == \
        [(p, k) for p in ("fp32", "bf16") for k in ("3", "12", "mix")]
    for r in report["rows"]:
        assert r["sliced_img_s"] > 0 and r["dense_img_s"] > 0
        if r["heads"] != "mix":  # one step each: the ratio is the two rates'
            assert r["fwd_bwd_ratio"] == pytest.approx(r["sliced_img_s"] / r["dense_img_s"])
            assert r["sliced_opt_ms"] > 0 and r["dense_opt_ms"] > 0
        s, d = r["sliced_memory"], r["dense_memory"]
        # every shared weight has a gradient and two AdamW moments, whatever k is
        assert s["held_mib"] == pytest.approx(3 * s["grads_mib"], rel=1e-3)  # and AdamW's step counts
        assert s["peak_mib"] > s["held_mib"] + s["activations_mib"] > s["held_mib"]
        if r["memory_heads"] == 12:  # the full model is the dense model of 12 heads: the same weights
            assert s["held_mib"] == pytest.approx(d["held_mib"], rel=1e-3)
        else:  # the sliced model holds (and AdamW updates) every head's weights
            assert s["held_mib"] > d["held_mib"] * (5 if r["memory_heads"] == 3 else 1)
    mix = report["rows"][2]
    assert mix["memory_heads"] == max(report["mix_draws"]) and len(report["mix_draws"]) == mix["steps"] == 3
    table = (out / "train_throughput.md").read_text()
    assert report["host"] in table and "bf16 instructions" in table and "| bf16 | mix |" in table
    assert (out / "train_throughput.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow  # starts a Python that imports torch
def test_a_head_count_the_preset_does_not_serve_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, BENCH, "--preset", "digits", "--heads", "3,13", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--heads: 13 neither a head count the digits preset serves (3..12)" in done.stderr
    assert not list(tmp_path.iterdir())
