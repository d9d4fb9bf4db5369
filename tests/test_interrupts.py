"""Ctrl-C (SIGINT) and SIGTERM in every long command: each real command, started as a user starts it on
tiny built-in data and stopped at a stage, ends with what it kept and the command line that goes on from
there, exit 130; never a traceback, click's "Aborted!", or the device command that happened to run."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from click.testing import CliRunner
from support.pythons import torch_free_python
from support.targets import HOST_TARGET

from hydra_edge.cli import main
from hydra_edge.commands.base import command
from hydra_edge.convert.pool import Commit
from hydra_edge.measure.journal import read_calibration
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.runtime.terminal import restore_signals, stop_on_signals

pytestmark = pytest.mark.slow  # trains, converts, calibrates and deploys, each stopped part-way

INTERNAL = ("Traceback", "Aborted", "sh -c", "exec 3<&0", "Error:")  # what an interruption never shows


def start(*args: object, group: bool = False) -> subprocess.Popen:
    """``hydra-edge ARGS`` in a process of its own, as a user runs it; its output (stderr too) in ``stdout``.
    ``group``: in a process group of its own, as a service manager starts it."""
    return subprocess.Popen([sys.executable, "-m", "hydra_edge.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=group)


def stop_when(proc: subprocess.Popen, ready: Callable[[], bool], sig: int = signal.SIGINT) -> str:
    """Send ``sig`` once ``ready()`` holds (within two minutes); the process's whole output once it ended."""
    try:
        deadline = time.monotonic() + 120
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the command ended before it could be stopped"
        proc.send_signal(sig)
        return proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def summary(proc: subprocess.Popen, output: str) -> tuple[str, list[str]]:
    """The interruption's two last lines: what was kept, and the resume command as argv."""
    assert proc.returncode == 130, output
    assert not any(text in output for text in INTERNAL), output
    kept, resume = output.strip().splitlines()[-2:]
    assert resume.startswith("Resume with: hydra-edge "), output
    return kept, shlex.split(resume.removeprefix("Resume with: "))


def test_ctrl_c_in_train_keeps_the_last_epoch_and_resume_goes_on_from_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--data", "digits", "--out", str(out), "--epochs", "3", "--threads", "1"]
    proc = start(*args)
    output = stop_when(proc, lambda: (out / "checkpoint.pt").is_file())
    kept, resume = summary(proc, output)
    assert kept == f"Interrupted: the checkpoint of the last finished epoch is kept in {out / 'checkpoint.pt'}."
    assert resume == ["hydra-edge", *args, "--resume"]
    resumed = subprocess.run([sys.executable, "-m", "hydra_edge.cli", *resume[1:]], capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "epoch 3/3" in resumed.stdout and "epoch 1/3" not in resumed.stdout, resumed.stdout


def test_ctrl_c_in_train_before_the_first_epoch_says_nothing_was_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start("train", "--data", "digits", "--out", out, "--epochs", "3", "--threads", "1")
    seen: list[str] = []

    def started() -> bool:  # the line said before the first epoch: it trains now
        seen.append(proc.stdout.readline())
        return seen[-1].startswith("training on digits")

    output = "".join(seen) + stop_when(proc, started)
    kept, resume = summary(proc, output)
    assert kept == f"Interrupted: no epoch had finished, so {out} holds nothing to go on from; the run starts again."
    assert resume[-1] == "--resume" and not (out / "checkpoint.pt").exists()


@pytest.mark.parametrize("after_s", [0.5, 3.0])
def test_sigterm_to_the_whole_group_in_train_with_loader_workers_is_the_same_stop(tmp_path: Path,
                                                                                 after_s: float) -> None:
    """systemd's stop and ``timeout`` signal every process of the group: the loader's workers die of it too,
    and their deaths must not end the run in "DataLoader worker ... is killed by signal: Terminated"."""
    out = tmp_path / "run"
    proc = start("train", "--data", "digits", "--out", out, "--epochs", "3", "--threads", "1", "--workers", "2",
                 group=True)
    seen: list[str] = []
    while not seen or not seen[-1].startswith("training on digits"):
        seen.append(proc.stdout.readline())
        assert seen[-1] or proc.poll() is None, "".join(seen)
    time.sleep(after_s)  # workers started (the first batches are theirs), the first epoch under way
    os.killpg(proc.pid, signal.SIGTERM)
    output = "".join(seen) + proc.communicate(timeout=120)[0]
    kept, resume = summary(proc, output)
    assert kept.startswith("Interrupted: ") and resume[-1] == "--resume", output
    assert "Exception ignored" not in output and "DataLoader" not in output, output


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A depth-2 digits HydraViT (untrained) and the profile it converts for: this machine, ONNX fp32."""
    root = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=2, heads=(3, 6, 12))).save(root / "tiny.pt")
    (root / "host.toml").write_text(HOST_TARGET)
    return root / "tiny.pt"


def test_ctrl_c_in_convert_keeps_each_finished_artefact(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    args = ["convert", "-c", str(checkpoint), "-t", str(checkpoint.parent / "host.toml"), "-o", str(out),
            "--heads", "3,6,12", "--eval-limit", "60", "--jobs", "1", "--layout", "full"]
    proc = start(*args)
    output = stop_when(proc, lambda: any(out.glob("vit_h*.onnx")))
    kept, resume = summary(proc, output)
    assert kept == (f"Interrupted: every artefact finished is kept in {out} and listed in its manifest; "
                    "the rest are converted when it resumes.")
    assert resume == ["hydra-edge", *args]


def test_ctrl_c_in_calibrate_keeps_each_measured_head_count(board: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    args = ["calibrate", "--bundle", str(board["bundle"]), "--local", "--python", str(torch_free_python(tmp_path)),
            "--out", str(out), "--runs", "4000", "--warmup", "0"]
    proc = start(*args)
    output = stop_when(proc, lambda: out.exists() and any(r.blocks for r in read_calibration(out).results))
    kept, resume = summary(proc, output)
    assert kept == (f"Interrupted: each head count measured and each block of runs timed so far is saved in {out}; "
                    "the rest are measured, going on from those blocks, when it resumes.")
    saved = read_calibration(out)
    assert resume == ["hydra-edge", *args] and len(saved.measured()) < 3 and any(r.blocks for r in saved.results)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_deploy_local_names_no_internal_command(board: dict[str, Path], tmp_path: Path,
                                                        sig: int) -> None:
    """The board app runs on until stopped (no --max-images): deploy stops it and says so in plain words,
    not as the shell wrapper that ran it."""
    args = ["deploy", "--bundle", str(board["bundle"]), "--lut", str(board["lut"]), "--local", "--images",
            str(board["images"]), "--python", str(torch_free_python(tmp_path)), "--remote-dir", str(tmp_path / "dev")]
    proc = start(*args)
    seen: list[str] = []

    def switched() -> bool:  # the app classifies once it has chosen its first head count
        seen.append(proc.stdout.readline())
        return seen[-1].startswith("switch None ->")

    output = "".join(seen) + stop_when(proc, switched, sig)
    kept, resume = summary(proc, output)
    assert kept == ("Interrupted: the app deploy started was stopped; the files already on the board stay there "
                    "and are not sent again.")
    assert resume == ["hydra-edge", *args]


def test_ctrl_c_in_demo_keeps_its_finished_stages(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["demo", "--out", str(out), "--epochs", "3", "--heads", "3,12", "--runs", "3", "--images", "2"]
    proc = start(*args)
    output = stop_when(proc, lambda: (out / "run" / "checkpoint.pt").is_file())  # stage 1 trains on from epoch 1
    kept, resume = summary(proc, output)
    assert kept == (f"Interrupted: every finished stage is kept in {out}, and the stage it stopped in goes on "
                    "from its last epoch, artefact or head count.")
    assert resume == ["hydra-edge", *args] and (out / "run" / "checkpoint.pt").is_file()


@pytest.mark.parametrize("args, inner, kept", [
    (["expand", "--bundle", "b", "--out", "files"], "hydra_edge.commands.expand.expand",
     "nothing: files gets its files only once every one has passed"),
    (["android-app", "--bundle", "b", "--lut", "lut.json", "--out", "demo.apk"], "hydra_edge.android.apk.build_apk",
     "nothing: demo.apk is written only once the APK is whole"),
], ids=["expand", "android-app"])
def test_ctrl_c_in_a_command_that_writes_only_when_whole_says_so(args: list[str], inner: str, kept: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """expand and android-app write their output whole or not at all: stopped while they work (here: as their
    work starts), they say nothing was kept and that the same command starts again."""
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(inner, interrupted)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and not any(text in result.output for text in INTERNAL), result.output
    assert result.output.splitlines() == [f"Interrupted: {kept}.", f"Resume with: hydra-edge {shlex.join(args)}"]


def test_sigterm_between_an_artefacts_rename_and_its_record_waits_for_the_record() -> None:
    """SIGTERM is Ctrl-C to a command, so it too waits while convert finishes recording a renamed
    artefact; a worker, which keeps SIGTERM's default, can still be terminated there."""
    previous = stop_on_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            with Commit() as commit:
                commit.hold()
                signal.raise_signal(signal.SIGTERM)
                recorded = True  # what runs here (the manifest record) is not cut short
        assert recorded
    finally:
        restore_signals(previous)
    default = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with Commit() as commit:
            commit.hold()
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, default)


def test_a_second_signal_while_a_command_says_it_was_stopped_is_ignored() -> None:
    """Ctrl-C then SIGTERM (or Ctrl-C twice): the second lands while the first's cleanup or summary runs and must
    not cut it with a traceback; the command still says what it kept, exit 130."""
    def kept(params: dict) -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, while the summary is being written
        time.sleep(0.1)
        return "what it kept"

    @command(kept=kept)
    def stopped() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    result = CliRunner().invoke(stopped, [])
    assert result.exit_code == 130 and "Interrupted: what it kept." in result.output, result.output
