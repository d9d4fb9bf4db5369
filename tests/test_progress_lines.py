"""What convert, demo and a resumed train print without a terminal: each artefact's list once (the
compacted ones under their own heading), stage titles whole, no empty training bar."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

import hydra_edge.commands.convert as convert_command
from hydra_edge.cli import main
from hydra_edge.commands.demo import _stage


def test_compacted_artefacts_are_listed_under_their_own_heading_not_as_done_twice(monkeypatch):
    sink = io.StringIO()
    monkeypatch.setattr(convert_command, "terminal", lambda: sink)
    log = convert_command._LogLines()
    for file, stage, size in (("h3.tflite", "export", None), ("h3.tflite", "done", 2**20),
                              ("h12.tflite", "done", 2**21), ("h3.tflite", "compact", None),
                              ("h3.tflite", "done", 2**19), ("h6.tflite", "skipped (unchanged)", None)):
        log(file, stage, size)
    assert sink.getvalue().splitlines() == [
        "h3.tflite: done (1.00 MiB)", "h12.tflite: done (2.00 MiB)",
        "compacting against the largest head count's weights (one weight set):",
        "h3.tflite: compacted (0.50 MiB)", "h6.tflite: skipped (unchanged)"]


def test_a_demo_stage_title_is_whole_when_stderr_is_no_terminal(capsys):
    title = "convert every subnetwork for a board with a rather long name, verified; one weight set (compact bundle)"
    _stage(2, title)
    assert f"2/5 {title}" in capsys.readouterr().err


@pytest.mark.slow  # trains through the command, twice
def test_a_resumed_run_with_every_epoch_trained_shows_no_empty_training_bar(tmp_path):
    args = ["train", "--heads", "3,12", "--batch-size", "512", "--epochs", "1", "--warmup-epochs", "0",
            "--out", str(tmp_path)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0 and "1/1" in first.output, first.output
    again = CliRunner().invoke(main, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert "all 1 epochs trained already" in again.output and "0/0" not in again.output, again.output


@pytest.mark.parametrize("jobs, said", [(1, "converting 1 artefact with"), (2, "converting 2 artefacts with")])
def test_the_artefact_count_is_singular_for_one(monkeypatch, jobs, said):
    import hydra_edge.convert.pipeline as pipeline

    lines: list[str] = []

    class Chosen:
        n, why = 1, "1 worker (--jobs 1)"

    monkeypatch.setattr(pipeline, "choose_jobs", lambda *a: Chosen())
    monkeypatch.setattr(pipeline, "replace", lambda job, **changes: job)
    monkeypatch.setattr(pipeline, "share_references", lambda jobs, report: [])  # stop before converting
    opts = type("Opts", (), {"jobs": 1, "out": "bundle"})()
    todo = type("Plan", (), {"skipped": [], "jobs": [object()] * jobs,
                             "manifest": type("M", (), {"write": lambda self, out: None})()})()
    pipeline._convert([opts], [todo], lambda *a: None, lines.append, model_bytes=1)
    assert lines[0].startswith(said), lines
