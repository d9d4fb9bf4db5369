"""The jetson int8 QDQ artefacts: still int8 where TensorRT wants it, without the Q/DQ pairs that slowed onnxruntime.

What onnxruntime runs is read from its own optimised graph (``SessionOptions.optimized_model_filepath``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper

from hydra_edge.commands.convert import convert
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.engines import check_golden, load, load_golden
from hydra_edge.train.data import load_data
from hydra_edge.train.loop import TrainSettings, train

pytestmark = pytest.mark.slow  # trains and converts a jetson bundle

HEADS = (3, 12)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained depth-2 digits model converted as the jetson profile ships it, int8 QDQ only, heads 3 and 12."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=2, heads=HEADS))
    trained = train(model, load_data("digits", model.config), TrainSettings(epochs=8, batch_size=64, warmup_epochs=1),
                    tmp_path_factory.mktemp("trained")).checkpoint
    out = tmp_path_factory.mktemp("jetson")
    result = CliRunner().invoke(convert, ["-c", str(trained), "-t", "jetson", "--quant", "int8-qdq",
                                          "--heads", ",".join(map(str, HEADS)), "-o", str(out), "--layout", "full"])
    assert result.exit_code == 0, result.output  # exit 0: each artefact passed the top-1 verification
    return out


def _optimised(path: Path, tmp: Path) -> onnx.GraphProto:
    """The graph onnxruntime's CPU provider runs, after its own fusions."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp / f"{path.stem}.optimised.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath).graph


def test_every_weighted_op_stays_int8_with_float_outputs_and_symmetric_activations(bundle: Path) -> None:
    for a in read_manifest(bundle).artefacts:
        graph = onnx.load(str(bundle / a.file)).graph
        made_by = {out: n for n in graph.node for out in n.output}
        inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        weighted = [n for n in graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
        assert {n.op_type for n in weighted} == {"MatMul", "Gemm", "Conv"}, a.file
        for n in weighted:  # TensorRT builds int8 kernels from a DequantizeLinear on each input
            assert all(made_by[i].op_type == "DequantizeLinear" for i in n.input[:2]), (a.file, n.name)
        for n in graph.node:
            if n.op_type == "QuantizeLinear":
                assert n.input[0] not in made_by or made_by[n.input[0]].op_type not in ("MatMul", "Gemm"), (a.file, n.name)
                assert not inits[n.input[2]].any(), (a.file, n.name)  # zero point 0: symmetric, as TensorRT requires


def test_onnxruntime_runs_softmax_in_float_and_the_patch_embedding_in_int8(bundle: Path, tmp_path: Path) -> None:
    for a in read_manifest(bundle).artefacts:
        ops = Counter(n.op_type for n in _optimised(bundle / a.file, tmp_path).node)
        assert ops["Softmax"] == 2 and "QLinearSoftmax" not in ops, (a.file, ops)
        assert ops["QLinearConv"] == 1 and "Conv" not in ops, (a.file, ops)
        assert ops["Gelu"] == 2, (a.file, ops)  # GELU fused into one op: no Q/DQ pair splits its pattern
        # 2 per block + the final one. onnxruntime fuses a residual Add into the next norm as a
        # SkipLayerNormalization, whose CPU kernel took 8x the Add and norm's time on every token: only
        # where the norm sees the cls token alone (the last block's second and the final one) is it fused
        assert ops["LayerNormalization"] + ops["SkipLayerNormalization"] == 5, (a.file, ops)
        assert ops["LayerNormalization"] >= 3, (a.file, ops)


def test_the_last_block_after_its_attention_runs_on_the_cls_token_alone(bundle: Path) -> None:
    """Both norms of every block see every token, but the last block's second norm and the final one
    see only the cls token: the last block's projection and MLP run for one token (``rewrites``)."""
    for a in read_manifest(bundle).artefacts:
        graph = onnx.shape_inference.infer_shapes(onnx.load(str(bundle / a.file))).graph
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*graph.input, *graph.value_info)}
        tokens = [shapes[n.input[0]][1] for n in graph.node if n.op_type == "LayerNormalization"]
        assert tokens == [17, 17, 17, 1, 1], (a.file, tokens)  # 16 patches + cls; blocks 1, 2; the final norm


def test_the_fp32_graph_gives_torch_s_logits(tmp_path: Path) -> None:
    from hydra_edge.convert import onnx as exporter

    torch.manual_seed(0)
    sub = HydraViT(preset("digits", depth=2)).subnetwork(5).eval()
    cfg = sub.config
    x = torch.randn(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    path = tmp_path / "fp32.onnx"
    with torch.no_grad():
        exporter.export(sub, x, "fp32", {}, np.zeros((1, *x.shape[1:]), np.float32), path, lambda s: None)
        expected = sub(x).numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_outputs_agree_with_eager_torch(bundle: Path) -> None:
    manifest = read_manifest(bundle)
    assert sorted(a.heads for a in manifest.artefacts) == list(HEADS)
    for a in manifest.artefacts:
        acc = a.accuracy
        assert acc["drop_pp"] <= 1.0 and acc["agreement"] >= 90.0, (a.file, acc)
        golden = load_golden(bundle / a.golden["file"])
        assert check_golden(load(bundle / a.file, threads=1), golden, a.golden["tolerance"]).ok, a.file
