"""The rpi int8 artefact is written as XNNPACK runs fastest, and keeps the eager model's outputs.

LiteRT's own op profiler (hydra_edge.profiling.litert) reads what the runtime executed: every op
inside XNNPACK, attention with K and V^T handed to the batch matmuls as rows of their output and
those matmuls in int8 (float32 where the profile asks), the heads' transposes moving int8, each
LayerNorm in eight operators; the file holds the patch convolution over patch rows with the weight
in the model's own layout. bench/op_profile_litert.py lays such profiles side by side.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.pythons import torch_free_python

from hydra_edge.convert.attention import attention_matmuls
from hydra_edge.convert.targets import load_target
from hydra_edge.convert.tflite import export, for_xnnpack, tensor_map
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.sizes import subnet_size
from hydra_edge.model.vit import PatchEmbed
from hydra_edge.profiling.litert import op_events, op_times
from hydra_edge.runtime.engines import load

pytestmark = pytest.mark.slow  # exports and profiles .tflite artefacts

DEPTH = 2
BENCH = Path(__file__).resolve().parents[1] / "bench" / "op_profile_litert.py"


@pytest.fixture(scope="module")
def subnet() -> torch.nn.Module:
    """Subnetwork 3 of a depth-2 ViT on 3-channel 8x8 images (so a patch row's (C, p, p) order matters)."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=DEPTH, in_chans=3), init_scheme="torch-default")
    return model.subnetwork(3).eval()


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((4, 3, 8, 8), dtype=np.float32)


def _export(subnet: torch.nn.Module, images: np.ndarray, path: Path, **options: str) -> Path:
    """The subnetwork exported as the rpi profile's int8-dynamic artefact, with ``options`` on top of its own."""
    variant = next(v for v in load_target("rpi").artefacts if (v.format, v.quant) == ("tflite", "int8-dynamic"))
    export(subnet, torch.from_numpy(images[:1]), variant.quant, {**variant.options, **options}, images, path,
           lambda s: None)
    return path


@pytest.fixture(scope="module")
def artefact(subnet: torch.nn.Module, images: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(subnet, images, tmp_path_factory.mktemp("rpi") / "vit_h3.tflite")


@pytest.fixture(scope="module")
def float_attention(subnet: torch.nn.Module, images: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(subnet, images, tmp_path_factory.mktemp("rpi") / "vit_h3.tflite", attention_matmuls="float32")


def test_the_rewrite_keeps_every_parameter_and_the_outputs(subnet: torch.nn.Module, images: np.ndarray) -> None:
    rewritten = for_xnnpack(subnet)
    ours, theirs = dict(subnet.named_parameters()), dict(rewritten.named_parameters())
    assert list(theirs) == list(ours) and all(torch.equal(theirs[n], p) for n, p in ours.items())
    x = torch.from_numpy(images)
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), subnet(x), rtol=1e-5, atol=1e-5)
    assert type(subnet.patch_embed) is PatchEmbed  # the caller's model is left as it was


def test_the_artefact_agrees_with_eager_torch(artefact: Path, subnet: torch.nn.Module, images: np.ndarray) -> None:
    engine = load(artefact, threads=1)
    with torch.no_grad():
        reference = subnet(torch.from_numpy(images)).numpy()
    for x, ref in zip(images, reference):
        out = engine.run(x[None])[0]
        cosine = float(out @ ref / np.linalg.norm(out) / np.linalg.norm(ref))
        assert cosine > 0.995, cosine


def test_liteRT_runs_every_op_in_xnnpack_with_k_transposed_inside_the_attention_matmul(
        artefact: Path, images: np.ndarray) -> None:
    per_type = op_times(artefact, images[:1], threads=1, runs=2)
    assert all("(" in op for op in per_type), per_type  # XNNPACK's operators; a TFLite kernel would be "BATCH_MATMUL"
    nodes = {(op, node) for op, node, _ in op_events(artefact, images[:1], threads=1, runs=1)}
    count = {kind: sum(op.startswith(kind) for op, _ in nodes)
             for kind in ("Convolution", "Fully Connected", "Batch Matrix Multiply", "Transpose", "Mean")}
    # per block: QKV, projection, fc1, fc2 and two batch matmuls, and four transposes (Q's and K's heads
    # out of QKV, V^T, heads back in: K's own transpose is inside the batch matmul), but in the last block
    # the cls token's query and its heads coming back are reshapes; the patch embedding is the one
    # convolution (its patches one transpose), the classifier one more FC; each LayerNorm (two per block,
    # the final one) two means, XNNPACK's "Mean Squared" one of them
    assert count == {"Convolution": 1, "Fully Connected": 4 * DEPTH + 1, "Batch Matrix Multiply": 2 * DEPTH,
                     "Transpose": 4 * DEPTH - 2 + 1, "Mean": 2 * (2 * DEPTH + 1)}
    assert sum(op.startswith("Mean Squared") for op, _ in nodes) == 2 * DEPTH + 1
    # the heads' transposes move int8 (quantised once, before them); the patches' moves the float image
    assert sum(op.startswith("Transpose (ND, X8)") for op, _ in nodes) == 4 * DEPTH - 2
    # int8 x int8 with fixed scales: XNNPACK's own kernel, not LiteRT's BATCH_MATMUL (ten times slower)
    assert {op for op in per_type if "Batch Matrix Multiply" in op} == {"Batch Matrix Multiply (NC, QS8) GEMM"}


def test_every_attention_matmul_takes_its_right_operand_as_rows_of_its_output(artefact: Path) -> None:
    """K and V^T as (output, reduction) rows (``adj_y``): XNNPACK packs that operand on every inference,
    and packed the other layout (V as it comes) measurably slower (docs/benchmarks.md)."""
    from ai_edge_litert import schema_py_generated as fb

    model = fb.ModelT.InitFromObj(fb.Model.GetRootAs(artefact.read_bytes(), 0))
    matmuls = [op for op in model.subgraphs[0].operators
               if model.operatorCodes[op.opcodeIndex].builtinCode == fb.BuiltinOperator.BATCH_MATMUL]
    assert len(matmuls) == 2 * DEPTH and all(op.builtinOptions.adjY and not op.builtinOptions.adjX for op in matmuls)


def test_attention_matmuls_stay_float32_where_the_profile_asks_and_nothing_else_changes(
        artefact: Path, float_attention: Path, images: np.ndarray) -> None:
    """A board without int8 dot products keeps them in float; either way every weight byte is the same."""
    per_type = op_times(float_attention, images[:1], threads=1, runs=1)
    assert {op for op in per_type if "Batch Matrix Multiply" in op} == {"Batch Matrix Multiply (NC, F32) GEMM"}
    weights = [{t.array(data).tobytes() for t in tensor_map(data) if t.dtype == np.int8}
               for data in (artefact.read_bytes(), float_attention.read_bytes())]
    assert weights[0] == weights[1] and len(weights[0]) == 4 * DEPTH + 2  # per block 4 linears; patch, head


@pytest.mark.parametrize("value", ["int4", 8, None])
def test_an_unknown_attention_option_is_one_line(value: object) -> None:
    with pytest.raises(HydraEdgeError) as e:
        attention_matmuls({"attention_matmuls": value}, "board.toml: tflite_int8-dynamic")
    assert str(e.value) == (f"board.toml: tflite_int8-dynamic: option attention_matmuls = {value!r}: give \"int8\" "
                            "(CPUs with int8 dot products) or \"float32\" (CPUs without) in the profile's "
                            "[artefacts.options]")


def test_the_patch_convolution_reads_patch_rows_and_stores_the_weight_in_its_own_layout(
        artefact: Path, subnet: torch.nn.Module) -> None:
    """XNNPACK's int8 convolution reads p channels per kernel tap (not the image's 3, which ran at a fraction
    of its FC rate), and the weight is stored as the model's (D, C, p, p), so compaction finds its rows."""
    from ai_edge_litert import schema_py_generated as fb

    model = fb.ModelT.InitFromObj(fb.Model.GetRootAs(artefact.read_bytes(), 0))
    graph = model.subgraphs[0]
    convs = [op for op in graph.operators if model.operatorCodes[op.opcodeIndex].builtinCode == fb.BuiltinOperator.CONV_2D]
    assert len(convs) == 1
    image, weight = (graph.tensors[i] for i in convs[0].inputs[:2])
    proj = subnet.patch_embed.proj
    assert image.shape[-1] == proj.kernel_size[0]
    assert tuple(weight.shape) == tuple(proj.weight.shape) and weight.type == fb.TensorType.INT8
    values = np.asarray(model.buffers[weight.buffer].data, np.uint8).view(np.int8).reshape(weight.shape)
    scales = np.asarray(weight.quantization.scale, np.float32).reshape(-1, 1, 1, 1)
    np.testing.assert_allclose(values * scales, proj.weight.detach().numpy(), atol=float(scales.max()) * 0.5001)


def test_the_op_profile_bench_lays_artefacts_side_by_side_and_names_the_host(artefact: Path, float_attention: Path,
                                                                             tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(BENCH),
                           str(artefact), str(float_attention), "--labels", "int8", "float", "--runs", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "op_profile_litert.json").read_text())
    assert "int8-relevant flags" in report["host"] and report["threads"] == 1
    int8, float32 = report["profiles"]
    assert (int8["label"], float32["label"]) == ("int8", "float")
    for p in (int8, float32):
        assert abs(sum(r["share"] for r in p["ops"]) - 1) < 0.01 and p["total_ms"] > 0
    counts = {p["label"]: {r["op"]: r["operators"] for r in p["ops"]} for p in (int8, float32)}
    assert counts["int8"]["Batch Matrix Multiply (NC, QS8) GEMM"] == counts["float"]["Batch Matrix Multiply (NC, F32) GEMM"]
    table = (out / "op_profile_litert.md").read_text()
    assert report["host"] in table and "| Batch Matrix Multiply (NC, QS8) GEMM |" in table
    assert (out / "op_profile_litert.png").read_bytes().startswith(b"\x89PNG")


def test_the_op_profile_bench_refuses_a_file_that_is_no_tflite_in_one_line(tmp_path: Path) -> None:
    skeleton, out = tmp_path / "vit_h3.skeleton", tmp_path / "results"
    skeleton.write_bytes(b"\0" * 64)
    done = subprocess.run([sys.executable, str(BENCH),
                           str(skeleton), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (f"error: {skeleton}: not a .tflite flatbuffer (no TFL3 identifier); a "
                                                    "compact bundle's skeleton is not one: hydra-edge expand writes the "
                                                    "full files")
    assert not out.exists()


KIT = Path(__file__).resolve().parents[1] / "bench" / "int8_efficiency_kit.py"


@pytest.fixture(scope="module")
def kit(artefact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kit of the 3-head artefact, once hollow (its int8 weights refilled there) and once whole."""
    out = tmp_path_factory.mktemp("kit") / "kit"
    done = subprocess.run([sys.executable, str(KIT), "pack", "--out", str(out), "--preset", "digits",
                           "--set", f"depth={DEPTH}", "--set", "in_chans=3", "--fc", "4x64x64", "--hollow-bytes", "512",
                           "--whole", "control", f"after:3={artefact}", f"control:3={artefact}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_a_kit_carries_the_weights_as_spreads_and_times_where_there_is_no_torch(kit: Path, artefact: Path,
                                                                              tmp_path: Path) -> None:
    index = json.loads((kit / "index.json").read_text())
    items = {i["series"]: i for i in index["items"]}
    assert items["after"]["spans"] and not items["control"]["spans"]  # the weights left out travel as spreads
    assert items["control"]["sha256"] == items["after"]["source_sha256"] == hashlib.sha256(artefact.read_bytes()).hexdigest()
    assert items["after"]["sha256"] != items["after"]["source_sha256"]  # refilled: other values, the same layout
    sizes = {name: (kit / i["file"]).stat().st_size for name, i in items.items()}
    assert sizes["after"] < sizes["control"]
    assert items["after"]["gmacs"] == items["control"]["gmacs"] == pytest.approx(
        subnet_size(preset("digits", depth=DEPTH, in_chans=3), 3).gmacs)
    out, python = tmp_path / "results", str(torch_free_python(tmp_path / "py"))
    done = subprocess.run([python, str(KIT), "time", str(kit), "--out", str(out), "--runs", "2", "--repeats", "2",
                           "--profile", "after k=3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "int8_efficiency_kit.json").read_text())
    assert "int8-relevant flags" in report["host"]
    rows = {(r["series"], r["repeat"]) for r in report["rows"]}
    assert rows == {(s, rep) for s in ("after", "control") for rep in (0, 1)}
    assert all(r["efficiency"] > 0 and r["fc_gmac_per_s"] > 0 for r in report["rows"])
    assert "Batch Matrix Multiply (NC, QS8) GEMM" in {o["op"] for o in report["profiles"]["after k=3"]["ops"]}
    assert report["host"] in (out / "int8_efficiency_kit.md").read_text()
    assert (out / "int8_efficiency_kit.png").read_bytes().startswith(b"\x89PNG")


def test_a_damaged_kit_is_refused_in_one_line(kit: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "kit"
    shutil.copytree(kit, damaged)
    index = json.loads((damaged / "index.json").read_text())
    after = next(i for i in index["items"] if i["series"] == "after")
    after["spans"][0][2] *= 2  # another spread: other bytes than the ones packed
    (damaged / "index.json").write_text(json.dumps(index))
    out, python = tmp_path / "results", str(torch_free_python(tmp_path / "py"))
    done = subprocess.run([python, str(KIT), "time", str(damaged), "--out", str(out), "--runs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (f"error: {damaged / after['file']}: rebuilt bytes do not match the "
                                                    "index's sha256; pack the kit again")
    assert not out.exists()
    index["items"][0]["file"] = "../outside.tflite.xz"  # a name that would leave the kit folder
    (damaged / "index.json").write_text(json.dumps(index))
    done = subprocess.run([python, str(KIT), "time", str(damaged), "--out", str(out), "--runs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not out.exists()
    assert done.stderr.strip().splitlines()[-1] == (f"error: {damaged / 'index.json'}: file '../outside.tflite.xz' is not "
                                                    "a name in the kit folder; pack the kit again")
    done = subprocess.run([python, str(KIT), "time", str(tmp_path / "nothing"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not out.exists()
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'nothing' / 'index.json'}: not a kit's index")


def test_a_kit_of_a_file_that_is_no_tflite_is_refused_in_one_line(tmp_path: Path) -> None:
    skeleton, out = tmp_path / "vit_h3.skeleton", tmp_path / "kit"
    skeleton.write_bytes(b"\0" * 64)
    done = subprocess.run([sys.executable, str(KIT), "pack", "--out", str(out), f"after:3={skeleton}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (f"error: {skeleton}: not a .tflite flatbuffer (no TFL3 identifier); "
                                                    "give .tflite artefacts")
    assert not out.exists() and list(tmp_path.iterdir()) == [skeleton]
