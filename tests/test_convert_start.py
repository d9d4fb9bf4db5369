"""A ``convert`` that stops at its start leaves nothing behind (no bundle folder, no ``.lock``); a refusal is one line.

The checkpoints here are untrained (what is checked is the run's start, never an artefact), so the file is fast.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.cli import cli_argv

from hydra_edge.commands.convert import convert
from hydra_edge.convert import pipeline
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT


def old_checkpoint(path: Path, classes: list[str], **extra: object) -> Path:
    """A digits HydraViT saved with ``classes`` as its class names, as ``train`` saved them: checkpoints written
    before training refused non-UTF-8 class folders carry such a name surrogate-escaped (``caf\\udce9``)."""
    HydraViT(preset("digits", depth=1, heads=(3, 12))).save(path, classes=classes, **extra)
    return path


def run(*args: str | Path) -> tuple[int, list[str]]:
    result = CliRunner().invoke(convert, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output.strip().splitlines()


def test_a_checkpoint_with_a_class_name_that_is_not_utf8_is_refused_in_one_line_creating_nothing(tmp_path, host):
    names = [str(d) for d in range(10)]
    names[3] = os.fsdecode(b"caf\xe9")  # the Latin-1 folder name as Python read it: "caf\udce9"
    checkpoint = old_checkpoint(tmp_path / "old.pt", names)
    out = tmp_path / "bundles" / "host"
    code, lines = run("-c", checkpoint, "-t", host, "-o", out, "--heads", "3")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"Error: {checkpoint}: class 3's name caf\\xe9 is not UTF-8 text"), lines
    assert "rename" in lines[0] and "train again" in lines[0], lines
    assert not (tmp_path / "bundles").exists()


def test_a_multi_target_convert_that_cannot_create_a_bundle_folder_removes_the_ones_it_created(tmp_path):
    """``-t rpi,jetson -o bundles`` where ``bundles/rpi`` is a file: ``bundles/android`` was created before the
    refusal and stayed, empty."""
    out = tmp_path / "bundles"
    out.mkdir()
    (out / "rpi").write_text("not a folder")
    code, lines = run("-c", old_checkpoint(tmp_path / "model.pt", [str(d) for d in range(10)]), "-t", "android,rpi",
                      "-o", out, "--heads", "3")
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"Error: cannot create output folder {out / 'rpi'}")
    assert sorted(p.name for p in out.iterdir()) == ["rpi"] and (out / "rpi").read_text() == "not a folder"


def test_ctrl_c_before_the_first_manifest_leaves_no_bundle_folder_nor_lock(tmp_path, host, monkeypatch):
    """Ctrl-C while the run plans (hashing a large checkpoint), the bundle folder locked, nothing written yet."""
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "plan", interrupted)
    out = tmp_path / "new" / "host"
    options = pipeline.ConvertOptions(checkpoint=old_checkpoint(tmp_path / "model.pt", [str(d) for d in range(10)]),
                                      target=str(host), out=out, heads="3")
    with pytest.raises(KeyboardInterrupt):
        pipeline.convert(options)
    assert not (tmp_path / "new").exists()


@pytest.mark.slow  # converts a bundle
def test_a_run_waiting_for_one_refused_at_its_start_converts_and_the_lock_stays_one(tmp_path, host, monkeypatch):
    """Two runs into one new --out: the first creates the folder, locks it and is refused while planning; the
    second, already waiting on that lock, must then convert as usual (no traceback on a lock file or folder the
    first removed), and a lock file must still be there for the second to hold while it runs."""
    checkpoint = old_checkpoint(tmp_path / "model.pt", [str(d) for d in range(10)])
    out = tmp_path / "new" / "host"
    waiting: list[subprocess.Popen] = []

    def refused_while_the_second_waits(*args: object, **kwargs: object) -> None:
        second = subprocess.Popen(cli_argv("convert", "-c", checkpoint, "-t", host, "-o", out, "--heads", "3"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        waiting.append(second)
        assert second.stdout is not None
        assert second.stdout.readline().startswith(f"waiting for bundle {out}: in use by pid {os.getpid()}")
        raise HydraEdgeError("refused")

    monkeypatch.setattr(pipeline, "plan", refused_while_the_second_waits)
    with pytest.raises(HydraEdgeError, match="^refused$"):
        pipeline.convert(pipeline.ConvertOptions(checkpoint=checkpoint, target=str(host), out=out, heads="3"))
    output, _ = waiting[0].communicate(timeout=300)
    assert waiting[0].returncode == 0 and "Traceback" not in output, output
    assert (out / "manifest.json").is_file() and (out / ".lock").is_file()


@pytest.mark.parametrize(("data", "expected"), [
    ({"source": "digits", "seed": 0, "val_fraction": 0.2, "shuffle": True}, "$: object contains unknown field `shuffle`"),
    ({"source": "digits", "seed": "0", "val_fraction": 0.2}, "$.seed: expected `int`, got `str`"),
])
def test_a_checkpoint_whose_data_record_is_wrong_is_refused_in_one_line_naming_the_field(tmp_path, host, data,
                                                                                          expected):
    checkpoint = old_checkpoint(tmp_path / "model.pt", [str(d) for d in range(10)], data=data)
    out = tmp_path / "bundles" / "host"
    code, lines = run("-c", checkpoint, "-t", host, "-o", out, "--heads", "3")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"Error: {checkpoint} ['data']: ") and expected in lines[0], lines
    assert not (tmp_path / "bundles").exists()
