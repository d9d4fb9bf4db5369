"""What a user can get wrong ends in one line and a non-zero exit, with nothing written: damaged
journals, lock notes and training state, folders where output files go, and numbers out of bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner, Result
from support.tables import calibration, fake_bundle

from hydra_edge.cli import main
from hydra_edge.commands.base import Number
from hydra_edge.commands.deploy import APP
from hydra_edge.errors import HydraEdgeError
from hydra_edge.lock import holder
from hydra_edge.measure.journal import RecordWriter, journal_path
from hydra_edge.measure.session import resume_or_start
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.train.data import load_data
from hydra_edge.train.loop import CHECKPOINT, TrainSettings, train

ROOT = Path(__file__).resolve().parents[1]
DEEP = "[" * 100_000 + "]" * 100_000


def cli(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result: Result, code: int = 1) -> str:
    """The error line of a command that failed as a user error should: no traceback, one ``Error:`` line."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    if code == 1:
        assert result.output.strip() == errors[0], result.output
    return errors[0]


# --- a calibration journal line nested 100,000 deep ---------------------------------------------------------


@pytest.fixture
def deep_journal(tmp_path: Path) -> tuple[Path, Path]:
    """A bundle and its calibration record, whose journal's second line is nested 100,000 deep."""
    bundle = fake_bundle(tmp_path / "bundle", [3, 12])
    record = tmp_path / "cal.json"
    RecordWriter(calibration(bundle, {3: 10, 12: 40}), record)
    with open(journal_path(record), "a") as journal:
        journal.write(DEEP + "\n")
    return bundle, record


def test_a_deeply_nested_journal_line_is_one_line_in_lut(deep_journal: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, record = deep_journal
    line = one_line(cli("lut", "-b", bundle, "-c", record, "--budget-ms", 50, "-o", tmp_path / "out"))
    assert f"{journal_path(record)} line 2 nests too deeply" in line and "calibrate again with --force" in line
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_journal_line_is_one_line_when_calibrate_resumes(deep_journal: tuple[Path, Path]) -> None:
    bundle, record = deep_journal
    identity = json.loads(journal_path(record).read_text().splitlines()[0])
    with pytest.raises(HydraEdgeError, match=r"line 2 nests too deeply to be a calibration journal entry"):
        resume_or_start(record, identity["device_id"], {"manifest_sha256": identity["manifest_sha256"]},
                        identity["settings"], force=False)


# --- a lock owner note with a time no clock can show --------------------------------------------------------


@pytest.mark.parametrize("since", [1e308, -1e20, "soon"])
def test_a_lock_note_with_an_impossible_time_still_names_its_holder(tmp_path: Path, since: object) -> None:
    lock_file = tmp_path / "record.json.lock"
    note = {"pid": 42, "host": "pi", "command": "hydra-edge calibrate", "since": since}
    lock_file.with_name(lock_file.name + ".owner").write_text(json.dumps(note))
    assert holder(lock_file) == "pid 42 on pi (`hydra-edge calibrate`, since an unknown time)"


def test_a_lock_note_that_is_a_fifo_or_nested_deep_is_an_unnamed_holder(tmp_path: Path) -> None:
    lock_file = tmp_path / "record.json.lock"
    os.mkfifo(lock_file.with_name(lock_file.name + ".owner"))  # a plain read would wait for a writer forever
    assert holder(lock_file) == "another process (it has not said which yet)"
    lock_file.with_name(lock_file.name + ".owner").unlink()
    lock_file.with_name(lock_file.name + ".owner").write_text(DEEP)
    assert holder(lock_file) == "another process (it has not said which yet)"


# --- folders where output files go -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lut.json", "lut.png"])
def test_lut_refuses_a_folder_where_an_output_goes_and_writes_nothing(tmp_path: Path, name: str) -> None:
    bundle = fake_bundle(tmp_path / "bundle", [3, 12])
    calibration(bundle, {3: 10, 12: 40}).write(tmp_path / "cal.json")
    (tmp_path / "out" / name).mkdir(parents=True)
    line = one_line(cli("lut", "-b", bundle, "-c", tmp_path / "cal.json", "--budget-ms", 50, "-o", tmp_path / "out"))
    assert f"{tmp_path / 'out' / name} is a folder" in line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]


def test_atomic_writes_refuse_a_folder_in_one_line(tmp_path: Path) -> None:
    from hydra_edge.atomic import write_text

    (tmp_path / "x.json").mkdir()
    with pytest.raises(HydraEdgeError, match=r"x\.json is a folder"):
        write_text(tmp_path / "x.json", "{}")
    assert list(tmp_path.iterdir()) == [tmp_path / "x.json"]  # no temporary file left beside it


# --- train --resume: outputs checked and the saved state validated before the first epoch ----------------


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-epoch run stopped after its second epoch (its checkpoint, as train writes it)."""
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 12)))
    train(model, load_data("digits", model.config), TrainSettings(epochs=2, batch_size=256, warmup_epochs=0), run)
    saved = torch.load(run / CHECKPOINT, weights_only=True)
    saved["train"]["settings"]["epochs"] = 3
    torch.save(saved, run / CHECKPOINT)
    return run / CHECKPOINT


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any training step fails the test: the error must come before the first epoch."""
    def step(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started")

    monkeypatch.setattr(torch.optim.AdamW, "step", step)


def damaged(run: Path, checkpoint: Path, change) -> Path:
    """``checkpoint`` copied into ``run`` with ``change`` applied to what it holds."""
    saved = torch.load(checkpoint, weights_only=True)
    change(saved)
    run.mkdir()
    torch.save(saved, run / CHECKPOINT)
    return run / CHECKPOINT


@pytest.mark.parametrize("name", [CHECKPOINT, "history.json", "accuracy.png"])
def test_train_refuses_a_folder_where_an_output_goes_before_training(tmp_path: Path, name: str,
                                                                     no_training: None) -> None:
    (tmp_path / "run" / name).mkdir(parents=True)
    line = one_line(cli("train", "--out", tmp_path / "run", "--resume", "--epochs", 1))
    assert f"{tmp_path / 'run' / name} is a folder" in line
    assert [p.name for p in (tmp_path / "run").iterdir()] == [name]


def _set(path: str, value: object):
    """A change that sets ``saved[a][b]...`` (path ``a.b``) to ``value``, or deletes it for ``...``."""
    *parents, last = path.split(".")

    def change(saved: dict) -> None:
        for key in parents:
            saved = saved[key]
        if value is ...:
            del saved[last]
        else:
            saved[last] = value
    return change


@pytest.mark.parametrize("path, value, field", [
    ("train.optimizer", ..., "$: object missing required field `optimizer`"),
    ("train", [1, 2], "$: expected `object`, got `array`"),
    ("train.history", 5, "$.history: expected `array`, got `int`"),
    ("train.settings.lr", float("nan"), "$.settings.lr: nan is not a finite number"),
    ("train.settings.epochs", "3", "$.settings.epochs: expected `int`, got `str`"),
    ("train.epoch", -5, "$.epoch: expected `int` >= 0"),
    ("train.epoch", 10**12, "$.epoch: expected `int` <= 100000"),
    ("train.epoch", 3, "$.epoch: 3 epochs trained, but the history holds 2"),
    ("train.history", [{"epoch": 1}], "$.history[0]: object missing required field `loss`"),
    ("train.optimizer", {"state": {}, "param_groups": []}, "$.optimizer: does not fit this model's optimizer"),
    ("train.schedule", {"last_epoch": "x"}, "$.schedule.last_epoch: expected `int`, got `str`"),
    ("data", {"sauce": "digits"}, "['data']: $: object contains unknown field `sauce`"),
])
def test_damaged_training_state_is_one_line_naming_the_field_before_training(
        tmp_path: Path, two_epochs: Path, no_training: None, path: str, value: object, field: str) -> None:
    checkpoint = damaged(tmp_path / "run", two_epochs, _set(path, value))
    before = checkpoint.read_bytes()
    line = one_line(cli("train", "--out", tmp_path / "run", "--resume"))
    assert str(checkpoint) in line and field in line
    assert checkpoint.read_bytes() == before and [p.name for p in (tmp_path / "run").iterdir()] == [CHECKPOINT]


def test_a_run_cut_to_fewer_epochs_than_it_trained_is_refused(tmp_path: Path, two_epochs: Path,
                                                            no_training: None) -> None:
    checkpoint = damaged(tmp_path / "run", two_epochs, lambda saved: None)
    line = one_line(cli("train", "--out", tmp_path / "run", "--resume", "--epochs", 1, "--override"))
    assert line == (f"Error: {checkpoint} has trained 2 epochs already; give --epochs 2 or more "
                    "(or leave it out to finish the run's own 3)")


def test_a_run_saved_before_settings_were_kept_still_resumes(tmp_path: Path, two_epochs: Path) -> None:
    damaged(tmp_path / "run", two_epochs, _set("train.settings", ...))
    result = cli("train", "--out", tmp_path / "run", "--resume", "--epochs", 3, "--batch-size", 256)
    assert result.exit_code == 0, result.output
    assert [h["epoch"] for h in json.loads((tmp_path / "run" / "history.json").read_text())] == [1, 2, 3]


def test_eval_refuses_a_folder_where_its_report_goes_and_damaged_data_in_one_line(tmp_path: Path, two_epochs: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import hydra_edge.train.evaluate

    def evaluate(*args: object, **kwargs: object) -> None:
        raise AssertionError("evaluation started")

    monkeypatch.setattr(hydra_edge.train.evaluate, "accuracy_per_heads", evaluate)
    checkpoint = damaged(tmp_path / "run", two_epochs, _set("data", {"source": "digits", "seed": -1}))
    line = one_line(cli("eval", "--checkpoint", checkpoint))
    assert line == (f"Error: {checkpoint} ['data']: $.seed: expected `int` >= 0; "
                    "train again into another --out (its weights still load with --checkpoint)")
    (tmp_path / "run" / "eval.png").mkdir()
    line = one_line(cli("eval", "--checkpoint", checkpoint, "--data", "digits"))
    assert f"{tmp_path / 'run' / 'eval.png'} is a folder" in line and not (tmp_path / "run" / "eval.json").exists()


# --- numbers a user types -------------------------------------------------------------------------------------


def test_every_number_option_of_every_command_is_bounded() -> None:
    unbounded = [f"{name} --{p.name}" for name, command in main.commands.items() for p in command.params
                 if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))
                 and not isinstance(p.type, Number)]
    assert unbounded == []


@pytest.mark.parametrize("option, value", [
    ("--soak-interval", "nan"), ("--soak-interval", "inf"), ("--soak-interval", "1e300"), ("--soak-interval", "0"),
    ("--runs", "1e13"), ("--runs", "10000000000000"), ("--warmup", "10000000000000"), ("--runs", "2.5"),
    ("--threads", "100000"), ("--adb-port", "70000"), ("--within", "0"), ("--within", "nan"),
    ("--cap-seconds", "inf"), ("--min-seconds", "-1"), ("--block-seconds", "1e300"), ("--gate-margin", "nan"),
    ("--gate-max-wait", "inf"),
])
def test_calibrate_numbers_out_of_bounds_are_refused_before_anything_runs(tmp_path: Path, option: str,
                                                                          value: str) -> None:
    result = cli("calibrate", "--bundle", tmp_path / "bundle", "--local", "--out", tmp_path / "cal", option, value)
    assert option in one_line(result, code=2) and not (tmp_path / "cal").exists()


def test_a_soak_longer_than_a_day_is_refused(tmp_path: Path) -> None:
    line = one_line(cli("calibrate", "--bundle", tmp_path / "bundle", "--local", "--out", tmp_path / "cal",
                        "--soak", "999999999999h"))
    assert "--soak" in line and "24h" in line and not (tmp_path / "cal").exists()


@pytest.mark.parametrize("command, option, value", [
    ("demo", "--epochs", "10000000000000"), ("demo", "--runs", "0"), ("demo", "--images", "-4"),
    ("deploy", "--max-images", "10000000000000"), ("deploy", "--max-images", "0"),
])
def test_demo_and_deploy_numbers_out_of_bounds_are_refused(tmp_path: Path, command: str, option: str,
                                                          value: str) -> None:
    args = {"demo": ["--out", tmp_path / "demo"],
            "deploy": ["--bundle", tmp_path, "--lut", tmp_path, "--local", "--images", tmp_path]}[command]
    result = cli(command, *args, option, value)
    assert option in one_line(result, code=2) and not (tmp_path / "demo").exists()


@pytest.mark.parametrize("option, value", [("--poll-s", "0"), ("--poll-s", "nan"), ("--poll-s", "inf"),
                                           ("--threads", "100000"), ("--threads", "0"), ("--max-images", "1e30"),
                                           ("--camera", "-1")])
def test_board_app_numbers_out_of_bounds_are_one_line(tmp_path: Path, option: str, value: str) -> None:
    proc = subprocess.run([sys.executable, str(APP), "--bundle", str(tmp_path / "bundle"), "--images", str(tmp_path),
                           "--plain", option, value], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("app.py: error: argument") and option in lines[-1], proc.stderr
