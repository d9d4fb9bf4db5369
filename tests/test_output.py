"""What ``hydra-edge`` prints: progress and results on the terminal, the converters' and runtimes'
own chatter in a log per artefact in the bundle, all of it on the terminal with ``-v``.

Real conversions (LiteRT int8 for the rpi profile) in real subprocesses, so C++ output written
straight to file descriptors 1 and 2 is part of what is checked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.train.data import DataSpec

pytestmark = pytest.mark.slow  # converts bundles to check what the terminal shows

ROOT = Path(__file__).resolve().parents[1]
ARTEFACT = "vit_h3_tflite_int8-dynamic"

# Lines libraries print on their own, seen in `hydra-edge demo` before they were routed to the logs.
NOISE = [
    r"absl::InitializeLog",  # absl: "All log messages before absl::InitializeLog() is called ..."
    r"oneDNN custom operations",  # TensorFlow's oneDNN banner
    r"^[IWEF]\d{4} ",  # glog/absl-formatted lines (I0000 ... port.cc, W1123 ... _pytree.py)
    r"Failed to load .*torchao",  # torchao's optional CUDA kernels
    r"_pytree\.py",  # torch pytree deprecation warnings
    r"FutureWarning|DeprecationWarning|UserWarning",  # Python warnings from the exporters
    r"LeafSpec|cls\.__new__",  # a FutureWarning and the source line Python prints under it
    r"converted in training mode",
    r"Created TensorFlow Lite XNNPACK delegate",  # LiteRT's banner at every interpreter
    r"Estimated count of arithmetic ops",  # the TFLite flatbuffer exporter
    r"Missing quantization parameter",
    r"onnxruntime:",  # onnxruntime's own warnings ("[W:onnxruntime:...")
    r"^WARNING:",  # Python logging's last-resort format
]
# What the log must hold: output of the exporter and of the runtime verifying the artefact (C++).
# The exporter's C++ lines depend on the host: its op-count line is not printed on every run, and
# TensorFlow prints its oneDNN banner only on CPUs with AVX-512; torch.export's FutureWarning is
# printed on every host.
CHATTER = [r"Estimated count of arithmetic ops|oneDNN custom operations|LeafSpec",
           r"Created TensorFlow Lite XNNPACK delegate"]


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(re.search(p, line) for p in NOISE)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained one-block digits HydraViT serving 3 heads: what is printed does not depend on training."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3,)))
    path = tmp_path_factory.mktemp("model") / "checkpoint.pt"
    model.save(path, data=DataSpec().to_dict())
    return path


def _hydra_edge(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_EDGE_VERBOSE", None)
    return subprocess.run([sys.executable, "-m", "hydra_edge.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _convert(checkpoint: Path, out: Path, *group: str) -> subprocess.CompletedProcess[str]:
    return _hydra_edge(*group, "convert", "-c", checkpoint, "-t", "rpi", "--heads", "3", "--eval-limit", "20",
                       "--out", out)


def test_convert_keeps_library_output_in_the_artefact_log(checkpoint: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    result = _convert(checkpoint, bundle)
    terminal = result.stdout + result.stderr
    assert result.returncode == 0, terminal
    assert _noise(terminal) == []
    assert f"{ARTEFACT}.tflite: done" in terminal
    assert f"converter output: {bundle / 'logs'}" in terminal.splitlines()
    log = (bundle / "logs" / f"{ARTEFACT}.log").read_text()
    assert log.startswith("# hydra-edge ") and f"{ARTEFACT}.tflite" in log.splitlines()[0]
    for chatter in CHATTER:
        assert re.search(chatter, log), f"{chatter!r} not in the log:\n{log}"

    # the device's runner prints the same LiteRT banner; calibrating this machine keeps it off the terminal
    calibrated = _hydra_edge("calibrate", "--bundle", bundle, "--local", "--runs", "2", "--warmup", "1",
                             "--out", tmp_path / "calibration.json", "--python", sys.executable)
    assert calibrated.returncode == 0, calibrated.stdout + calibrated.stderr
    assert _noise(calibrated.stdout + calibrated.stderr) == []


def test_conversion_workers_keep_what_their_imports_print_in_the_log(checkpoint: Path, tmp_path: Path) -> None:
    """Two targets, two worker processes: each imports the converters up front, and their banners
    (absl, oneDNN, torchao) go to the first bundle's workers.log, not to the terminal."""
    out = tmp_path / "bundles"
    result = _hydra_edge("convert", "-c", checkpoint, "-t", "rpi,android", "--heads", "3", "--eval-limit", "20",
                         "--jobs", "2", "--out", out)
    terminal = result.stdout + result.stderr
    assert result.returncode == 0, terminal
    assert "2 workers (--jobs 2)" in terminal
    assert _noise(terminal) == [], terminal
    log = (out / "rpi" / "logs" / "workers.log").read_text()
    assert log.count("# hydra-edge ") == 2 and "importing" in log  # one header per worker
    # TensorFlow's banners (C++) where the CPU has AVX-512; torchao's missing CUDA kernels on every CPU-only host
    assert re.search(r"oneDNN custom operations|absl::InitializeLog|Failed to load .*torchao", log), log


def test_verbose_shows_library_output_and_still_logs_it(checkpoint: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    result = _convert(checkpoint, bundle, "-v")
    terminal = result.stdout + result.stderr
    assert result.returncode == 0, terminal
    log = (bundle / "logs" / f"{ARTEFACT}.log").read_text()
    for chatter in CHATTER:
        assert re.search(chatter, terminal), f"{chatter!r} not on the terminal with -v:\n{terminal}"
        assert re.search(chatter, log)


CAPTURED = """
import ctypes, logging, os, sys, time, warnings
from pathlib import Path
from hydra_edge.logs import capture, terminal

log = Path(sys.argv[1])
try:
    with capture(log, "test"):
        os.write(1, b"fd one\\n")
        os.write(2, b"fd two\\n")
        ctypes.CDLL(None).puts(b"from C stdio")
        print("python print")
        warnings.warn("python warning")
        logging.getLogger("lib").warning("python logging")
        print("ready", file=terminal(), flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("restored on interrupt", file=sys.stderr, flush=True)
    os.write(1, b"stdout restored\\n")
"""
INSIDE = ["fd one", "fd two", "from C stdio", "python print", "python warning", "python logging"]


@pytest.mark.parametrize("verbose", [False, True])
def test_capture_takes_every_kind_of_output_and_gives_the_terminal_back_on_ctrl_c(tmp_path: Path,
                                                                                 verbose: bool) -> None:
    log = tmp_path / "logs" / "a.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_EDGE_VERBOSE": "1" if verbose else "0"}
    proc = subprocess.Popen([sys.executable, "-c", CAPTURED, str(log)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdout is not None
    said = []
    while "ready" not in (line := proc.stderr.readline()):  # the terminal is the test's pipe
        assert line, "the script ended before it was ready"
        said.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.stdout.read(), proc.stderr.read()  # small; read() keeps what readline() buffered
    proc.wait(timeout=60)
    terminal = "".join(said) + out + err
    assert proc.returncode == 0, terminal
    written = log.read_text()
    for line in INSIDE:
        assert line in written
        assert (line in terminal) == verbose, terminal
    assert "restored on interrupt" in err and "stdout restored" in out
    assert "restored" not in written
