"""A board whose only TFLite interpreter is the real tflite-runtime 2.14.0 (its last release), with numpy<2.

tflite-runtime cannot load the rpi artefacts (FULLY_CONNECTED version 12), so the device code refuses
them in one line naming what to install, before computing anything. Needs pip and the network.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_edge.config import preset
from hydra_edge.convert.formats import exporter
from hydra_edge.model import HydraViT

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
    subnet = HydraViT(preset("digits", depth=2, heads=(3, 6))).subnetwork(3)
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
