"""Nested int8: every head count's int8 weights and scales are slices of the 12-head artefact's, read from the files."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_edge.convert.formats import exporter
from hydra_edge.convert.nesting import nested_ranges
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.pipeline import convert
from hydra_edge.convert.targets import load_target
from hydra_edge.errors import HydraEdgeError
from hydra_edge.formats import FORMATS
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.slicing import weight_index
from hydra_edge.records.manifest import read_manifest
from hydra_edge.train.data import load_data
from hydra_edge.train.loop import TrainSettings, train

pytestmark = pytest.mark.slow  # converts nested int8 artefacts

CASES = [("tflite", "int8-dynamic"), ("executorch", "int8-dynamic"), ("onnx", "int8-qdq")]
LINEAR = {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Depth-1 digits HydraViT serving 3, 6 and 12 heads, trained a few seconds (non-zero biases and norms);
    one block holds every kind of weight, and each block more only lengthens every export."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 6, 12)))
    out = tmp_path_factory.mktemp("trained")
    return train(model, load_data("digits", model.config), TrainSettings(epochs=4, batch_size=64, warmup_epochs=1),
                 out).checkpoint


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> HydraViT:
    from hydra_edge.model.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)


def _images() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((8, 1, 8, 8), dtype=np.float32)


def _export(model: HydraViT, k: int, fmt: str, quant: str, nested: bool, path: Path) -> bytes:
    """Subnetwork k as the shipped profiles convert it; nested or quantised on its own."""
    options = {v.key: v.options for t in ("rpi", "android", "jetson") for v in load_target(t).artefacts}
    ranges = nested_ranges(model.named_parameters(), k, functools.partial(weight_index, cfg=model.config, k=k))
    images = _images()
    exporter(fmt).export(model.subnetwork(k), torch.from_numpy(images[:1]), quant, options.get(f"{fmt}_{quant}", {}),
                         images, path, lambda stage: None, ranges=ranges if nested else None)
    return path.read_bytes()


def _candidates(fmt: str, data: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """(int8 values with the output channel first, per-channel scales) that may be a weight of the file."""
    if fmt == "tflite":
        from ai_edge_litert import schema_py_generated as fb

        m = fb.ModelT.InitFromObj(fb.Model.GetRootAs(data, 0))
        out = []
        for t in m.subgraphs[0].tensors:
            q = t.quantization
            if t.type == fb.TensorType.INT8 and q is not None and q.scale is not None and len(q.scale) > 1:
                values = np.asarray(m.buffers[t.buffer].data, np.uint8).view(np.int8).reshape(t.shape)
                out.append((np.moveaxis(values, q.quantizedDimension, 0), np.asarray(q.scale, np.float32)))
        return out
    if fmt == "onnx":
        import onnx
        from onnx import numpy_helper

        g = onnx.load_from_string(data).graph
        inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        out = []
        for n in g.node:
            if n.op_type == "DequantizeLinear" and inits.get(n.input[0], np.zeros(0)).dtype == np.int8:
                axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
                scale = inits[n.input[1]]
                if scale.ndim == 1:
                    out.append((np.moveaxis(inits[n.input[0]], axis, 0), scale))
        return out
    # .pte: XNNPACK keeps each constant as named data, int8 weights [out, in] and scales under "scale_<sha256>"
    from executorch.exir._serialize._program import deserialize_pte_binary

    store = deserialize_pte_binary(data).named_data
    blobs = {key: bytes(store.buffers[e.buffer_index]) for key, e in store.pte_data.items()}
    scales = [np.frombuffer(b, np.float32) for key, b in blobs.items() if key.startswith("scale_")]
    values = [np.frombuffer(b, np.int8) for key, b in blobs.items() if not key.startswith("scale_")]
    return [(v, s) for v in values for s in scales if v.size % s.size == 0]


def int8_weights(fmt: str, data: bytes, sub: torch.nn.Module) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{weight name: (int8 in torch layout, scales)}``, each file tensor identified by its values: q*s within s/2 of w."""
    found, candidates = {}, _candidates(fmt, data)
    for name, w in sub.named_parameters():
        w = w.detach().numpy()
        if not name.endswith(".weight") or w.ndim < 2:
            continue
        for q, s in candidates:
            if q.size == w.size and s.size == w.shape[0]:
                q = q.reshape(w.shape)
                err = np.abs(q * s.reshape(-1, *[1] * (w.ndim - 1)) - w).max(axis=tuple(range(1, w.ndim)))
                if np.all(err <= s * 0.5001 + 1e-7):
                    found[name] = (q, s)
                    break
    return found


@pytest.mark.parametrize("fmt, quant", CASES, ids=[f"{f}-{q}" for f, q in CASES])
def test_every_int8_weight_and_scale_is_a_slice_of_the_largest(model: HydraViT, tmp_path: Path, fmt: str,
                                                                quant: str) -> None:
    suffix = FORMATS[fmt].suffix
    largest = _export(model, 12, fmt, quant, True, tmp_path / f"n12{suffix}")
    assert largest == _export(model, 12, fmt, quant, False, tmp_path / f"p12{suffix}")  # the largest is unchanged
    full = int8_weights(fmt, largest, model.subnetwork(12))
    assert {n.split(".", 2)[2].rsplit(".", 1)[0] for n in full if n.startswith("blocks.")} == LINEAR
    assert "head.weight" in full
    cfg = model.config
    k = 3
    sub = int8_weights(fmt, _export(model, k, fmt, quant, True, tmp_path / f"n{k}{suffix}"), model.subnetwork(k))
    assert sub.keys() == full.keys()
    for name, (q, s) in sub.items():
        index = tuple(np.asarray(i) if isinstance(i, torch.Tensor) else i for i in weight_index(name, cfg, k))
        assert np.array_equal(q, full[name][0][index]), name
        assert s.tobytes() == full[name][1][index[0]].tobytes(), name

RPI = """name = "nest"
threads = 1
[[artefacts]]
format = "tflite"
quant = "int8-dynamic"
runtime = "ai-edge-litert"
runtime_min_version = "2.3.0"
"""


def test_manifest_records_nested_against_per_subnetwork_top1(model: HydraViT, checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "nest.toml").write_text(RPI)
    (tmp_path / "never.toml").write_text(RPI + "[artefacts.options]\nnest_max_cost_pp = -1.0\n")
    result = convert(ConvertOptions(checkpoint=checkpoint, target=str(tmp_path / "nest.toml"), out=tmp_path / "a",
                                    heads="3,12"))
    assert not result.failed
    for a in read_manifest(tmp_path / "a").artefacts:
        n = a.nesting
        assert n.nested and n.images == a.accuracy["images"] == 360 and n.max_cost_pp == 0.3
        assert n.cost_pp == round(n.top1_per_subnetwork - n.top1_nested, 4) == n.evidence.cost_pp
        assert n.evidence.passed and (n.evidence.decided_by == "logits" or n.evidence.high_pp <= 0.3)
        assert 10 < n.sqnr_db_nested < 100 and 10 < n.sqnr_db_per_subnetwork < 100  # int8 noise: small, not none
        if a.heads == 12:  # the largest head count's scales are its own: nothing to measure
            assert n.top1_nested == n.top1_per_subnetwork and n.cost_pp == 0
            assert n.sqnr_db_nested == n.sqnr_db_per_subnetwork
    # a stricter bound than nesting can meet: quantised on its own, and the manifest says so
    result = convert(ConvertOptions(checkpoint=checkpoint, target=str(tmp_path / "never.toml"), out=tmp_path / "b",
                                    heads="3"))
    assert not result.failed
    (a,) = read_manifest(tmp_path / "b").artefacts
    assert not a.nesting.nested and a.nesting.max_cost_pp == -1.0
    own = _export(model, 3, "tflite", "int8-dynamic", False, tmp_path / "own.tflite")
    assert int8_weights("tflite", (tmp_path / "b" / a.file).read_bytes(), model.subnetwork(3)).keys() == \
        int8_weights("tflite", own, model.subnetwork(3)).keys()
    for name, (q, s) in int8_weights("tflite", (tmp_path / "b" / a.file).read_bytes(), model.subnetwork(3)).items():
        q_own, s_own = int8_weights("tflite", own, model.subnetwork(3))[name]
        assert np.array_equal(q, q_own) and s.tobytes() == s_own.tobytes()


def test_a_bad_cost_bound_is_one_line_and_writes_nothing(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(RPI + '[artefacts.options]\nnest_max_cost_pp = "a little"\n')
    with pytest.raises(HydraEdgeError) as e:
        convert(ConvertOptions(checkpoint=checkpoint, target=str(tmp_path / "bad.toml"), out=tmp_path / "b"))
    assert str(e.value) == (f"{tmp_path / 'bad.toml'}: tflite_int8-dynamic: option nest_max_cost_pp = 'a little': "
                            "give the p.p. of top-1 nesting may cost as a number in [-100, 100] (default 0.3) in the "
                            "profile's [artefacts.options]")
    assert not (tmp_path / "b").exists()


def test_a_classifier_per_head_count_keeps_its_own_ranges(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 12), separate_heads=True))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_()  # non-zero biases and norms, so no two constants are equal
    ranges = nested_ranges(model.named_parameters(), 3, functools.partial(weight_index, cfg=model.config, k=3))
    assert "blocks.0.attn.qkv.weight" in ranges and not any(n.startswith("head") for n in ranges)
    nested, own = (int8_weights("tflite", _export(model, 3, "tflite", "int8-dynamic", flag, tmp_path / f"{flag}.tflite"),
                                model.subnetwork(3)) for flag in (True, False))
    assert nested["head.weight"][1].tobytes() == own["head.weight"][1].tobytes()
    assert nested["blocks.0.attn.qkv.weight"][1].tobytes() != own["blocks.0.attn.qkv.weight"][1].tobytes()


def test_one_flipped_image_of_eight_is_judged_by_how_far_its_logits_moved(
        model: HydraViT, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 8 inputs one flipped arg-max is 12.5 p.p., and 8 images cannot tell that from 0: the logits'
    error decides. A near tie that swapped under a tiny error costs nothing; an image whose logits
    moved far is a cost, with labels or without."""
    from hydra_edge.convert import nesting
    from hydra_edge.convert.verify import EvalSet

    sub, images = model.subnetwork(3), _images()
    ranges = nested_ranges(model.named_parameters(), 3, functools.partial(weight_index, cfg=model.config, k=3))
    reference = np.eye(10, dtype=np.float32)[np.arange(8)] * 5  # image i's logits point at class i
    reference[0, 1] = 4.99999  # image 0: a near tie between classes 0 and 1
    own = reference + np.random.default_rng(0).standard_normal(reference.shape).astype(np.float32) * 1e-3
    own[0, :2] = [5.0005, 4.9995]  # noise of 1e-3 under both choices; image 0 still right with its own scales
    tie_swapped = own.copy()
    tie_swapped[0, :2] = [4.9995, 5.0005]  # as much error, the tie fallen the other way
    far_moved = own.copy()
    far_moved[0] = np.roll(far_moved[0], 3)
    for outputs, labels, nested in [(tie_swapped, None, True), (tie_swapped, np.arange(8), True),
                                    (far_moved, None, False), (far_moved, np.arange(8), False)]:
        calls = iter([own, outputs])  # own scales first, then nested
        monkeypatch.setattr(nesting, "fake_quant_logits", lambda *args, **kwargs: next(calls))
        n = nesting.measure(sub, ranges, EvalSet(images, labels, "held-out"), reference, 0.3)
        assert (n.cost_pp, n.nested, n.evidence.decided_by, n.evidence.worse) == (12.5, nested, "logits", 1), (labels, n)
        assert n.top1_nested == (None if labels is None else 87.5)
