"""A board whose only TFLite interpreter is the real tflite-runtime 2.14.0 (its last release), with numpy<2.

tflite-runtime cannot load the rpi artefacts (FULLY_CONNECTED version 12), so the device code refuses
them in one line naming what to install, before computing anything. The rpi-tflite-runtime target's
artefacts (fp32) run there: the device code rebuilds them from a compact bundle and they pass their
golden pairs in tflite-runtime itself. Needs pip and the network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hydra_edge.cli import main
from hydra_edge.convert.formats import exporter
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.records.manifest import read_manifest

pytestmark = pytest.mark.slow  # builds a tflite-runtime venv

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="session")
def tflite_runtime_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with tflite-runtime 2.14.0, numpy<2, msgspec and pillow, and no ai-edge-litert."""
    venv = tmp_path_factory.mktemp("tflite-runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "tflite-runtime==2.14.0", "numpy<2", "msgspec",
                    "pillow"], check=True)
    return python


@pytest.fixture(scope="module")
def rpi_artefact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rpi target's int8-dynamic artefact of a small subnetwork, as ``hydra-edge convert`` writes it."""
    torch.manual_seed(0)
    subnet = HydraViT(preset("digits", depth=1, heads=(3, 6))).subnetwork(3)
    images = np.random.default_rng(1).standard_normal((2, 1, 8, 8), dtype=np.float32)
    path = tmp_path_factory.mktemp("rpi") / "m.tflite"
    exporter("tflite").export(subnet, torch.from_numpy(images[:1]), "int8-dynamic", {}, images, path,
                              lambda stage: None)
    return path


def test_tflite_runtime_itself_refuses_the_rpi_artefacts(tflite_runtime_python: Path, rpi_artefact: Path) -> None:
    code = ("from tflite_runtime.interpreter import Interpreter;"
            f"Interpreter(model_path=r'{rpi_artefact}').allocate_tensors()")
    done = subprocess.run([str(tflite_runtime_python), "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "'FULLY_CONNECTED' version '12'" in done.stderr


def test_the_device_code_refuses_in_one_line_naming_what_to_install(tflite_runtime_python: Path,
                                                                     rpi_artefact: Path) -> None:
    code = ("import sys; from hydra_edge.errors import HydraEdgeError; from hydra_edge.runtime.engines import load\n"
            "try:\n"
            f"    load(r'{rpi_artefact}')\n"
            "except HydraEdgeError as e:\n"
            "    print(e); sys.exit(3)\n"
            "print('ran')")
    done = subprocess.run([str(tflite_runtime_python), "-c", code], capture_output=True, text=True, cwd=ROOT)
    line = done.stdout.strip()
    assert done.returncode == 3, (done.stdout, done.stderr[-1500:])
    assert "\n" not in line and "cannot run m.tflite" in line and "pip install ai-edge-litert" in line
    assert "tflite-runtime cannot run these artefacts" in line and "FULLY_CONNECTED version 12" in line


@pytest.fixture(scope="module")
def variant_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hydra-edge convert -t rpi-tflite-runtime`` of a digits model, compact: the 3-head artefact is a
    skeleton and a recipe, rebuilt on the device from the 6-head one."""
    root = tmp_path_factory.mktemp("rpi-tflite-runtime")
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=1, heads=(3, 6))).save(root / "m.pt")
    result = CliRunner().invoke(main, ["convert", "-c", str(root / "m.pt"), "-t", "rpi-tflite-runtime",
                                       "--heads", "3,6", "-o", str(root / "bundle"), "--eval-limit", "16"])
    assert result.exit_code == 0, result.output
    return root / "bundle"


def test_the_variant_is_verified_on_the_host_and_names_tflite_runtime(variant_bundle: Path) -> None:
    manifest = read_manifest(variant_bundle)
    assert [(a.heads, a.format, a.quant, a.runtime, a.runtime_min_version) for a in manifest.artefacts] == \
        [(k, "tflite", "fp32", "tflite-runtime", "2.14.0") for k in (3, 6)]
    assert all(a.host_runtime.startswith("ai-edge-litert ") for a in manifest.artefacts)
    assert manifest.artefacts[0].compact is not None and manifest.artefacts[1].compact is None
    assert not (variant_bundle / manifest.artefacts[0].file).exists()


def test_the_calibration_runner_times_the_variant_in_tflite_runtime(tflite_runtime_python: Path,
                                                                     variant_bundle: Path) -> None:
    """What a board runs: the calibration runner, in the tflite-runtime venv, rebuilds the 3-head artefact,
    checks both against their golden pairs in tflite-runtime itself and times them."""
    done = subprocess.run([str(tflite_runtime_python), "calibration/runner.py", "--bundle", str(variant_bundle),
                           "--runs", "3", "--warmup", "1", "--threads", "1"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and events[-1]["event"] == "done", (done.stdout[-2000:], done.stderr[-2000:])
    runtimes = events[0]["runtimes"]
    assert runtimes["tflite-runtime"] == "2.14.0" and "ai-edge-litert" not in runtimes  # the venv has no LiteRT
    results = [e for e in events if e["event"] == "result"]
    assert [(r["heads"], r["status"], r["golden"]["passed"]) for r in results] == [(3, "ok", True), (6, "ok", True)]
    assert "rebuild_s" in results[0] and "rebuild_s" not in results[1]  # 3 heads rebuilt from the 6-head bytes
    assert all(r["golden"]["max_abs_diff"] < 1e-4 and r["latency"]["p50_ms"] > 0 for r in results), results


def test_int8_artefacts_stay_refused_on_tflite_runtime_beside_the_variant(tflite_runtime_python: Path,
                                                                          rpi_artefact: Path) -> None:
    """Only a record naming tflite-runtime may run there: the rpi int8 artefact, loaded as its record
    would load it (runtime ai-edge-litert), is refused in one line before anything runs."""
    code = ("import sys; from hydra_edge.errors import HydraEdgeError; from hydra_edge.runtime.engines import load\n"
            "try:\n"
            f"    load(r'{rpi_artefact}', runtime='ai-edge-litert')\n"
            "except HydraEdgeError as e:\n"
            "    print(e); sys.exit(3)\n")
    done = subprocess.run([str(tflite_runtime_python), "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 3, (done.stdout, done.stderr[-1500:])
    assert "pip install ai-edge-litert" in done.stdout and "--target rpi-tflite-runtime" in done.stdout
