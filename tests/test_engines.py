"""Device engines: each format's artefact, run through ``runtime.engines``, matches eager torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.bounded import without_blocking

from hydra_edge.convert.formats import exporter
from hydra_edge.convert.targets import load_target
from hydra_edge.errors import HydraEdgeError
from hydra_edge.formats import FORMATS
from hydra_edge.measure.device import RuntimeMissingError, ensure_python, runtime_requirements
from hydra_edge.model.config import HydraConfig, preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.runtime import engines
from hydra_edge.runtime.engines import check_golden, compare, format_of, load
from hydra_edge.transport import LocalTransport

# (format, quant, relative L2 error allowed against eager fp32)
CASES = [
    ("onnx", "fp32", 1e-5), ("onnx", "fp16", 1e-2), ("onnx", "int8-qdq", 0.2),
    ("tflite", "int8-dynamic", 0.1), ("executorch", "int8-dynamic", 0.1),
]


@pytest.fixture(scope="module")
def subnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return HydraViT(preset("digits", depth=1, heads=(3, 6))).subnetwork(3)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((6, 1, 8, 8), dtype=np.float32)


def _export(subnet: torch.nn.Module, fmt: str, quant: str, images: np.ndarray, folder: Path) -> Path:
    """Export with the shipped profiles' options for this format and quant (QDQ: MatMul/Gemm only)."""
    options = {v.key: v.options for t in ("rpi", "android", "jetson") for v in load_target(t).artefacts}
    path = folder / f"m_{quant}{FORMATS[fmt].suffix}"
    exporter(fmt).export(subnet, torch.from_numpy(images[:1]), quant, options.get(f"{fmt}_{quant}", {}), images,
                         path, lambda stage: None)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt, quant, rel", CASES, ids=[f"{f}-{q}" for f, q, _ in CASES])
def test_artefact_matches_eager_torch(subnet, images, tmp_path: Path, fmt: str, quant: str, rel: float) -> None:
    path = _export(subnet, fmt, quant, images, tmp_path)
    engine = load(path, threads=1)
    assert engine.format.name == fmt
    out = engine.run(images)
    with torch.no_grad():
        ref = subnet(torch.from_numpy(images)).numpy()
    assert out.shape == ref.shape == (6, 10) and out.dtype == np.float32
    assert np.linalg.norm(out - ref) <= rel * np.linalg.norm(ref)


def test_golden_check_passes_the_right_runtime_and_fails_garbage(subnet, images, tmp_path: Path) -> None:
    from hydra_edge.convert.verify import golden_tolerance

    engine = load(_export(subnet, "onnx", "fp16", images, tmp_path))
    with torch.no_grad():
        reference = subnet(torch.from_numpy(images)).numpy()
    tolerance = golden_tolerance(engine.run(images), reference)
    golden = {"inputs": images, "reference": reference}
    assert check_golden(engine, golden, tolerance).ok
    rng = np.random.default_rng(0)
    garbage = engines.Engine(engine.path, engine.format, 1, lambda x: rng.standard_normal((1, 10)).astype(np.float32))
    check = check_golden(garbage, golden, tolerance)
    assert not check.ok and "allowed" in check.describe()
    assert compare(reference[:, :5], reference) == (float("inf"), 0.0)


def test_device_side_imports_no_torch(subnet, images, tmp_path: Path) -> None:
    onnx_path = _export(subnet, "onnx", "fp32", images, tmp_path)
    np.save(tmp_path / "x.npy", images)
    code = (
        "import sys, numpy as np; from hydra_edge.runtime.engines import load;"
        f"y = load(r'{onnx_path}', threads=2).run(np.load(r'{tmp_path / 'x.npy'}'));"
        "assert y.shape == (6, 10); assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_unknown_artefacts_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(HydraEdgeError, match="unknown artefact type '.bin'"):
        format_of(tmp_path / "m.bin")
    with pytest.raises(HydraEdgeError, match="does not exist"):
        load(tmp_path / "missing.onnx")
    with pytest.raises(HydraEdgeError, match="unknown format 'coreml'"):
        load(tmp_path / "m.onnx", format="coreml")


def tflite_runtime_only_python(root: Path) -> Path:
    """A board's Python that has tflite-runtime 2.14.0 (and numpy) but no ai-edge-litert.

    tflite-runtime cannot be installed here (no network), so its package is an empty one with
    real metadata: whether a device is refused depends only on what its Python can import.
    """
    site = root / "site"
    (site / "tflite_runtime").mkdir(parents=True)
    (site / "tflite_runtime" / "__init__.py").write_text("")
    (site / "tflite_runtime-2.14.0.dist-info").mkdir()
    (site / "tflite_runtime-2.14.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tflite-runtime\nVersion: 2.14.0\n")
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = sys.modules['ai_edge_litert'] = None\n")
    wrapper = root / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


NEEDS = {"numpy": "numpy", "ai_edge_litert": "ai-edge-litert>=2.3.0"}


def test_a_device_with_only_tflite_runtime_is_refused_up_front(tmp_path: Path) -> None:
    """tflite-runtime 2.14 refuses these artefacts (FULLY_CONNECTED version 12): the host's probe says
    so in one line, with a command that can be pasted as it is, and the device code will not start."""
    python = tflite_runtime_only_python(tmp_path)
    with LocalTransport(tmp_path / "device") as t:
        with pytest.raises(RuntimeMissingError) as info:
            ensure_python(t, str(python), NEEDS, setup=False)
    line = str(info.value)
    assert "\n" not in line and "lacks the Python package(s) ai-edge-litert>=2.3.0" in line
    assert "tflite-runtime cannot run these artefacts" in line and "FULLY_CONNECTED version 12" in line
    assert f"`{python} -m pip install 'ai-edge-litert>=2.3.0'`" in line
    code = f"from hydra_edge.runtime.engines import check_runtimes; check_runtimes({NEEDS!r})"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode != 0 and "HydraEdgeError: this device lacks the Python package(s) ai-edge-litert" in done.stderr
    assert "tflite-runtime cannot run these artefacts" in done.stderr and "'ai-edge-litert>=2.3.0'" in done.stderr


def test_a_device_with_only_tflite_runtime_takes_artefacts_whose_records_name_it(tmp_path: Path) -> None:
    """The rpi-tflite-runtime target's records name tflite-runtime: that is what the device must have,
    and what its engine imports when it is there; the host, without it, runs them in ai-edge-litert."""
    variant = load_target("rpi-tflite-runtime").variants()[0]
    int8 = load_target("rpi").variants()[0]
    assert (variant.format, variant.quant, variant.runtime) == ("tflite", "fp32", "tflite-runtime")
    assert engines.runtimes_of([variant]) == {"tflite_runtime": "tflite-runtime>=2.14.0"}
    assert engines.runtimes_of([int8]) == {"ai_edge_litert": "ai-edge-litert>=2.3.0"}
    assert runtime_requirements([variant]) == {"numpy": "numpy", "tflite_runtime": "tflite-runtime>=2.14.0",
                                               "msgspec": "msgspec>=0.18"}
    python = tflite_runtime_only_python(tmp_path)
    needs = {"numpy": "numpy", **engines.runtimes_of([variant])}
    with LocalTransport(tmp_path / "device") as t:
        assert ensure_python(t, str(python), needs, setup=False) == str(python)
    code = ("from hydra_edge.runtime.engines import check_runtimes, runtime_module; "
            "from hydra_edge.formats import FORMATS; "
            f"check_runtimes({needs!r}); "
            "print(runtime_module(FORMATS['tflite'], 'tflite-runtime'), runtime_module(FORMATS['tflite'], 'ai-edge-litert'))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 0 and done.stdout.split() == ["tflite_runtime", "ai_edge_litert"], done.stderr
    assert engines.runtime_module(FORMATS["tflite"], "tflite-runtime") == "ai_edge_litert"  # this host has no tflite-runtime


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["executorch", "tflite"])
def test_an_engine_loaded_from_bytes_keeps_them_alive_and_runs_like_the_file(subnet, images, tmp_path: Path,
                                                                             fmt: str) -> None:
    """The runtimes read a model given as bytes in place (executorch keeps no copy of its own): the engine
    must keep them. A fresh process loads a bytearray of the file, drops every reference of its own, churns
    the heap, then runs; a crash (SIGSEGV) or other outputs than the file's fail here."""
    path = _export(subnet, fmt, "int8-dynamic", images, tmp_path)
    np.save(tmp_path / "x.npy", images)
    code = (
        "import gc, sys, numpy as np; from hydra_edge.runtime.engines import load, load_bytes;"
        f"x = np.load(r'{tmp_path / 'x.npy'}'); data = bytearray(open(r'{path}', 'rb').read());"
        f"engine = load_bytes(data, r'{path.name}'); del data; gc.collect();"
        "junk = [bytes([i % 251]) * 4096 for i in range(20000)];"
        f"assert np.array_equal(engine.run(x), load(r'{path}').run(x)); print('same outputs')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 0 and "same outputs" in done.stdout, (done.returncode, done.stderr[-1500:])


@pytest.mark.parametrize("how", ["profile", "--quant"])
def test_a_variant_may_name_tflite_runtime_only_for_what_runs_correctly_there(tmp_path: Path, how: str) -> None:
    """int8 .tflite on tflite-runtime 2.14 is refused at load or silently wrong: a profile naming it, or
    --quant turning the rpi-tflite-runtime target's fp32 into int8, is one line before anything converts."""
    target = "rpi-tflite-runtime"
    if how == "profile":
        target = str(tmp_path / "board.toml")
        Path(target).write_text('[[artefacts]]\nformat = "tflite"\nquant = "int8-dynamic"\n'
                                'runtime = "tflite-runtime"\nruntime_min_version = "2.14.0"\n')
    with pytest.raises(HydraEdgeError) as info:
        load_target(target).variants(quant="int8-dynamic" if how == "--quant" else None)
    line = str(info.value)
    assert "\n" not in line and "tflite-runtime runs only fp32 tflite artefacts correctly, not int8-dynamic" in line
    assert ("board.toml: $.artefacts[0].runtime" in line) == (how == "profile")


@pytest.mark.parametrize("machine, flags, saturates", [
    ("x86_64", "fpu sse avx2 fma", True),  # AVX2 only: vpmaddubsw's 16-bit pair sums
    ("x86_64", "fpu avx2 avx512f avx512_vnni", False), ("x86_64", "fpu avx2 avx_vnni", False),
    ("x86_64", "fpu avx2 amx_int8 amx_tile", False), ("aarch64", "fp asimd", False),
])
def test_onnxruntime_int8_saturation_is_decided_from_the_cpus_int8_instructions(machine: str, flags: str,
                                                                                 saturates: bool) -> None:
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    assert engines.int8_kernels_saturate(cpuinfo, machine) is saturates


def test_an_int8_qdq_artefact_runs_as_written_whatever_the_cpu(tmp_path: Path, b16_like: HydraConfig) -> None:
    """The engine computes what the QDQ graph says (dequantize, then the float op: what TensorRT computes).
    On an x86 without VNNI onnxruntime's fused int8 kernels saturate (logits off by over 10 % here);
    the engine then runs the Q/DQ pairs as written."""
    import onnxruntime as ort

    torch.manual_seed(0)
    sub = HydraViT(b16_like).subnetwork(3).eval()
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32), dtype=np.float32)
    path = _export(sub, "onnx", "int8-qdq", x, tmp_path)
    as_written = ort.SessionOptions()
    as_written.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), as_written, providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {session.get_inputs()[0].name: x[i : i + 1]})[0] for i in range(4)])
    out = load(path, threads=1).run(x)
    assert np.linalg.norm(out - want) <= 0.05 * np.linalg.norm(want)  # saturated: 16 % on an AVX2-only EPYC


def _golden_pair(folder: Path) -> dict:
    """A golden record whose outputs and shared inputs are files of ``folder``, with their sha256."""
    from hydra_edge.atomic import sha256_file

    folder.mkdir(exist_ok=True)
    np.savez(folder / "in.npz", inputs=np.ones((2, 1, 8, 8), np.float32))
    np.savez(folder / "out.npz", reference=np.zeros((2, 10), np.float32), outputs=np.zeros((2, 10), np.float32))
    return {"file": "out.npz", "sha256": sha256_file(folder / "out.npz"),
            "inputs_file": "in.npz", "inputs_sha256": sha256_file(folder / "in.npz")}


def test_a_golden_pair_is_what_its_record_names_or_one_line(tmp_path: Path) -> None:
    from hydra_edge.runtime.engines import load_golden_pair

    golden = _golden_pair(tmp_path / "b")
    pair = load_golden_pair(tmp_path / "b", golden)
    assert set(pair) == {"inputs", "reference", "outputs"} and pair["inputs"].shape == (2, 1, 8, 8)
    np.savez(tmp_path / "b" / "in.npz", inputs=np.zeros((2, 1, 8, 8), np.float32))  # valid, other values
    with pytest.raises(HydraEdgeError, match=f"^{tmp_path / 'b' / 'in.npz'}: golden.inputs_file sha256 is "):
        load_golden_pair(tmp_path / "b", golden)


@pytest.mark.parametrize("name", ["in.npz", "out.npz"])
def test_a_fifo_in_place_of_a_golden_file_is_one_line_and_never_blocks(tmp_path: Path, name: str) -> None:
    from hydra_edge.runtime.engines import load_golden, load_golden_pair

    golden = _golden_pair(tmp_path / "b")
    path = tmp_path / "b" / name
    path.unlink()
    os.mkfifo(path)
    for read in (lambda: load_golden(path), lambda: load_golden_pair(tmp_path / "b", golden)):
        error = without_blocking(read, path)
        assert isinstance(error, HydraEdgeError) and f"{path} is a FIFO" in str(error), error
