"""`hydra-edge demo` end to end (small settings): every stage's files exist, the bundle is compact
(every head count but the largest rebuilt on the device from a skeleton and a recipe), the app switched,
and the terminal showed no library chatter. Run as a user runs it, in a process of its own, so that
what native code writes to the terminal's descriptors is seen too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_edge.measure.journal import read_calibration
from hydra_edge.records.manifest import read_manifest
from hydra_edge.records.recipe import read_recipe

pytestmark = pytest.mark.slow  # runs the whole demo


def test_demo_runs_the_whole_pipeline_on_a_compact_bundle_and_resumes(tmp_path: Path) -> None:
    args = ["demo", "--out", str(tmp_path), "--epochs", "2", "--heads", "3,12", "--runs", "3", "--images", "2",
            "--jobs", "1"]
    code, output = demo(args)
    assert code == 0, output
    assert (tmp_path / "run" / "accuracy.png").is_file()
    bundle = tmp_path / "bundle"
    small, large = read_manifest(bundle).artefacts
    assert (small.heads, large.heads) == (3, 12) and small.format == large.format == "tflite"
    # one weight set: the 12-head file whole; 3 heads as skeleton + recipe, its own file never written
    assert large.compact is None and (bundle / large.file).is_file() and not (bundle / small.file).exists()
    recipe = read_recipe(bundle / small.compact.recipe)
    assert (bundle / recipe.skeleton.file).is_file() and recipe.source.file == large.file
    calibration = read_calibration(next((tmp_path / "calibration").glob("*.json")))
    assert [(r.heads, r.golden["passed"]) for r in calibration.measured()] == [(3, True), (12, True)]
    assert calibration.result(3).rebuild_s > 0 and not isinstance(calibration.result(12).rebuild_s, float)
    table = json.loads((tmp_path / "lut" / "lut.json").read_text())
    assert table["calibration"]["device_id"] == calibration.device_id
    assert {p.name for p in (tmp_path / "lut").iterdir()} >= {"lut.json", "hydra_lut.h", "HydraLut.kt", "lut.png"}
    report = json.loads((tmp_path / "app" / "events.json").read_text())
    events = report["events"]
    assert events[0]["reason"] == "start" and events[0]["reading"]["battery_pct"] == 100
    # the app ran every head count it switched to from the compact bundle, none fell back for a failed load
    assert not any(e["reason"].startswith("load failed") for e in events) and report["fallback"] is None
    assert set(report["per_heads"]) <= {str(e["to"]) for e in events} and report["per_heads"]
    assert "Where everything is:" in output and str(tmp_path / "lut") in output
    # LiteRT's banner ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.") is in the app's
    # runtime log, named on the terminal, and nowhere on the terminal itself
    assert "XNNPACK" not in output, output
    # nor what the conversion workers' imports print (absl's and TensorFlow's oneDNN banners)
    assert "absl::InitializeLog" not in output and "oneDNN" not in output, output
    assert "XNNPACK" in (tmp_path / "app" / "runtime.log").read_text()
    assert f"runtime output: {tmp_path / 'app' / 'runtime.log'}" in output

    before = {p: p.read_bytes() for p in [tmp_path / "run" / "checkpoint.pt", *(tmp_path / "calibration").glob("*.json")]}
    # a second run resumes: nothing is trained, converted or timed again; -v shows the runtime's banner too
    code, output = demo(["-v", *args])
    assert code == 0, output
    assert "0 converted, 2 unchanged" in output and "INFO: Created TensorFlow Lite XNNPACK delegate" in output
    assert all(p.read_bytes() == data for p, data in before.items())


def demo(args: list[str]) -> tuple[int, str]:
    """``hydra-edge ARGS`` in a process of its own: its exit code, and its stdout and stderr together."""
    done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1200, env={**os.environ, "COLUMNS": "200"})
    return done.returncode, done.stdout
