"""The rpi int8 artefact is written as XNNPACK runs fastest, and keeps the eager model's outputs.

LiteRT's own op profiler (bench/op_profile_litert.py) reads what the runtime executed: every op
inside XNNPACK, the patch embedding as a fully-connected layer (no convolution), and attention
with K's transpose folded into the batch matmul.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_edge.config import preset
from hydra_edge.convert.targets import load_target
from hydra_edge.convert.tflite import export, for_xnnpack
from hydra_edge.model import HydraViT
from hydra_edge.runtime.engines import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.op_profile_litert import op_events, op_times  # noqa: E402

DEPTH = 2


@pytest.fixture(scope="module")
def subnet() -> torch.nn.Module:
    """Subnetwork 3 of a depth-2 ViT on 3-channel 8x8 images (so a patch row's (C, p, p) order matters)."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=DEPTH, in_chans=3), init_scheme="torch-default")
    return model.subnetwork(3).eval()


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((4, 3, 8, 8), dtype=np.float32)


@pytest.fixture(scope="module")
def artefact(subnet: torch.nn.Module, images: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The subnetwork exported as the rpi profile's int8-dynamic artefact."""
    variant = next(v for v in load_target("rpi").artefacts if (v.format, v.quant) == ("tflite", "int8-dynamic"))
    path = tmp_path_factory.mktemp("rpi") / "vit_h3.tflite"
    export(subnet, torch.from_numpy(images[:1]), variant.quant, dict(variant.options), images, path, lambda s: None)
    return path


def test_the_rewrite_keeps_every_parameter_and_the_outputs(subnet: torch.nn.Module, images: np.ndarray) -> None:
    rewritten = for_xnnpack(subnet)
    ours, theirs = dict(subnet.named_parameters()), dict(rewritten.named_parameters())
    assert list(theirs) == list(ours)
    for name, p in ours.items():  # the patch weight is flattened to (D, C*p*p), rows and row order unchanged
        assert torch.equal(theirs[name].detach(), p.detach().reshape(theirs[name].shape)), name
    x = torch.from_numpy(images)
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), subnet(x), rtol=1e-5, atol=1e-5)
    assert type(subnet.patch_embed.proj) is torch.nn.Conv2d  # the caller's model is left as it was


def test_the_artefact_agrees_with_eager_torch(artefact: Path, subnet: torch.nn.Module, images: np.ndarray) -> None:
    engine = load(artefact, threads=1)
    with torch.no_grad():
        reference = subnet(torch.from_numpy(images)).numpy()
    for x, ref in zip(images, reference):
        out = engine.run(x[None])[0]
        cosine = float(out @ ref / np.linalg.norm(out) / np.linalg.norm(ref))
        assert cosine > 0.995, cosine


def test_liteRT_runs_every_op_in_xnnpack_with_the_patch_embedding_as_a_fully_connected_layer(
        artefact: Path, images: np.ndarray) -> None:
    per_type = op_times(artefact, images[:1], threads=1, runs=2)
    assert all("(" in op for op in per_type), per_type  # XNNPACK's operators; a TFLite kernel would be "BATCH_MATMUL"
    assert not [op for op in per_type if op.startswith("Convolution")]
    nodes = {(op, node) for op, node, _ in op_events(artefact, images[:1], threads=1, runs=1)}
    count = {kind: sum(op.startswith(kind) for op, _ in nodes)
             for kind in ("Fully Connected", "Batch Matrix Multiply", "Transpose")}
    # per block: QKV, projection, fc1, fc2 and two batch matmuls, and two transposes (heads out of QKV,
    # heads back in: K's own transpose is inside the batch matmul); the patch embedding and the classifier
    # are one FC each, the patches one transpose
    assert count == {"Fully Connected": 4 * DEPTH + 2, "Batch Matrix Multiply": 2 * DEPTH, "Transpose": 2 * DEPTH + 1}

