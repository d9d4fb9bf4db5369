"""hydra-edge as a user gets it from a wheel: installed outside the checkout, run from an empty folder.

The wheel is built from the project's files (what a fresh clone holds), installed without
dependencies into a new venv that borrows this venv's site-packages (nothing is downloaded), and
its console script then lists the targets, converts, calibrates on this machine, builds the table,
deploys to the sshd stand-in, and runs the demo. Every data file the commands need (target profiles, the device runner, the board
app) must come from the wheel: the checkout is not on the path and the working folder is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support.sshd import SshServer

from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT

pytestmark = pytest.mark.slow  # builds the wheel and installs it in a fresh venv

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("hydra_edge/shipped/targets/rpi.toml", "hydra_edge/shipped/targets/jetson.toml",
           "hydra_edge/shipped/targets/android.toml", "hydra_edge/shipped/calibration/runner.py",
           "hydra_edge/shipped/board-demo/app.py")


def project_files(dest: Path) -> Path:
    """The checkout's tracked and new (not ignored) files copied to ``dest``: what a fresh clone builds from."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, dest / name
        if not source.is_symlink() and not source.exists():  # deleted but not yet committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the ``hydra-edge`` script of a fresh venv that has only that wheel of hydra-edge)."""
    root = tmp_path_factory.mktemp("package")
    source = project_files(root / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(root / "wheels"), str(source)], check=True, env=clean_env())
    wheel = next((root / "wheels").glob("hydra_edge-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies come from this venv: a path line, so its editable hydra_edge hook is not loaded.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, env=clean_env())
    return wheel, venv / "bin" / "hydra-edge"


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: nothing of the checkout may be importable."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def hydra_edge(script: Path, cwd: Path, *args: object) -> str:
    done = subprocess.run([str(script), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=clean_env(), timeout=600)
    assert done.returncode == 0, f"hydra-edge {args[0]}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_carries_the_profiles_the_runner_and_the_app(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in SHIPPED:
            assert name in names
            assert z.read(name) == (ROOT / name).read_bytes()  # the file itself, not the link to it


def test_the_installed_package_converts_calibrates_and_deploys_from_an_empty_folder(
        installed: tuple[Path, Path], sshd_server: SshServer, tmp_path: Path) -> None:
    _, script = installed
    work = tmp_path / "empty"
    work.mkdir()
    listed = hydra_edge(script, work, "targets")
    shipped = Path(script).parents[1] / "lib"  # the venv's own site-packages, not the checkout
    assert all("shipped  " in line and str(shipped) in line for line in listed.splitlines()[1:4]), listed
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=1, heads=(3, 6, 12))).save(tmp_path / "tiny.pt")

    hydra_edge(script, work, "convert", "-c", tmp_path / "tiny.pt", "--target", "rpi", "--heads", "3,12",
               "--eval-limit", 40, "--out", "bundle")
    manifest = json.loads((work / "bundle" / "manifest.json").read_text())
    assert manifest["target"]["name"] == "rpi" and [a["heads"] for a in manifest["artefacts"]] == [3, 12]

    hydra_edge(script, work, "calibrate", "--bundle", "bundle", "--local", "--runs", 3, "--warmup", 1,
               "--out", "calibration", "--sysfs-root", tmp_path / "sysfs")
    record = next((work / "calibration").glob("*.json"))
    assert [r["heads"] for r in json.loads(record.read_text())["results"] if r["status"] == "ok"] == [3, 12]

    hydra_edge(script, work, "lut", "--bundle", "bundle", "--calibration", record, "--budget-ms", 1000, "--out", "lut")
    assert (work / "lut" / "lut.json").is_file()

    images = work / "images" / "0"
    images.mkdir(parents=True)
    for i in range(2):
        Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8), mode="L").save(images / f"{i}.png")
    remote = tmp_path / "board"
    out = hydra_edge(script, work, "deploy", "--bundle", "bundle", "--lut", "lut", "--host", sshd_server.spec,
                     "--identity", sshd_server.identity_file, "--known-hosts", sshd_server.known_hosts,
                     "--remote-dir", remote, "--images", "images", "--max-images", 2, "--python", sys.executable)
    assert "2 images" in out, out
    assert (remote / "app" / "app.py").read_bytes() == (ROOT / "apps" / "board-demo" / "app.py").read_bytes()
    assert sorted(p.name for p in work.iterdir()) == ["bundle", "calibration", "images", "lut"]


def test_the_installed_demo_runs_from_an_empty_folder(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, script = installed
    # the jetson board (ONNX fp16): the rpi profile's path through the installed package is the test above's
    out = hydra_edge(script, tmp_path, "demo", "--target", "jetson", "--epochs", 1, "--heads", "3,12", "--runs", 3,
                     "--images", 2, "--jobs", 1)
    assert "Where everything is:" in out
    assert [p.name for p in tmp_path.iterdir()] == ["hydra-edge-demo"]
    events = json.loads((tmp_path / "hydra-edge-demo" / "app" / "events.json").read_text())["events"]
    # the Jetson's thermal zone path (under /sys/devices/virtual/) is read: the day's first step, 45 degrees
    assert events[0]["reason"] == "start" and events[0]["reading"]["thermal"] == 45.0, events[0]
