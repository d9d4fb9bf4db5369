"""`hydra-edge demo` end to end (small settings): every stage's files exist and the app switched."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from hydra_edge.calibrate.record import read_calibration
from hydra_edge.cli import main
from hydra_edge.convert.manifest import read_manifest


def test_demo_runs_the_whole_pipeline_and_resumes(tmp_path: Path) -> None:
    args = ["demo", "--out", str(tmp_path), "--epochs", "2", "--heads", "3,12", "--runs", "3", "--images", "2",
            "--jobs", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "accuracy.png").is_file()
    assert [a.heads for a in read_manifest(tmp_path / "bundle").artefacts] == [3, 12]
    calibration = read_calibration(next((tmp_path / "calibration").glob("*.json")))
    assert [r.heads for r in calibration.measured()] == [3, 12]
    table = json.loads((tmp_path / "lut" / "lut.json").read_text())
    assert table["calibration"]["device_id"] == calibration.device_id
    assert {p.name for p in (tmp_path / "lut").iterdir()} >= {"lut.json", "hydra_lut.h", "HydraLut.kt", "lut.png"}
    events = json.loads((tmp_path / "app" / "events.json").read_text())["events"]
    assert events[0]["reason"] == "start" and events[0]["reading"]["battery_pct"] == 100
    assert "Where everything is:" in result.output and str(tmp_path / "lut") in result.output

    before = {p: p.read_bytes() for p in [tmp_path / "run" / "checkpoint.pt", *(tmp_path / "calibration").glob("*.json")]}
    again = CliRunner().invoke(main, args)  # a second run resumes: nothing is trained, converted or timed again
    assert again.exit_code == 0, again.output
    assert "0 converted, 2 unchanged" in again.output
    assert all(p.read_bytes() == data for p, data in before.items())
