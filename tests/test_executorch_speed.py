"""The android .pte runs whole inside XNNPACK, agrees with eager torch, and its op profile names XNNPACK's ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_edge.convert import executorch
from hydra_edge.model.config import HydraConfig
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.profiling.executorch import op_times
from hydra_edge.runtime.engines import load

pytestmark = pytest.mark.slow  # exports and profiles .pte artefacts


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], torch.nn.Module, np.ndarray]:
    # ViT-B/16 widths on 64 px (17 tokens): the digits model's ops take under the profiler's 1 us tick
    torch.manual_seed(0)
    sub = HydraViT(HydraConfig(img_size=64, depth=1, num_classes=10)).eval().subnetwork(3).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    out = tmp_path_factory.mktemp("pte")
    paths = {}
    for key, quant, options in (("fp32", "fp32", {}), ("int8-dynamic", "int8-dynamic", {}),
                                ("float-attention", "int8-dynamic", {"attention_matmuls": "float32"})):
        paths[key] = out / f"{key}.pte"
        with torch.no_grad():
            executorch.export(sub, torch.from_numpy(x), quant, options, x, paths[key], lambda s: None)
    return paths, sub, x


def test_the_whole_network_runs_in_one_xnnpack_delegate_call(exported: tuple[dict[str, Path], torch.nn.Module, np.ndarray]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import KernelCall

    for path in exported[0].values():
        plan = deserialize_pte_binary(path.read_bytes()).program.execution_plan[0]
        kernels = {plan.operators[i.instr_args.op_index].name for i in plan.chains[0].instructions
                   if isinstance(i.instr_args, KernelCall)}
        # no LayerNorm, expand, squeeze or class-token select between delegate calls: each call costs
        # XNNPACK a shape pass over all its operators
        assert not kernels and len(plan.delegates) == 1, (path.name, kernels, len(plan.delegates))


def test_xnnpack_layer_norm_agrees_with_eager_torch(exported: tuple[dict[str, Path], torch.nn.Module, np.ndarray]) -> None:
    paths, sub, x = exported
    with torch.no_grad():
        reference = sub(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(load(paths["fp32"]).run(x), reference, rtol=1e-4, atol=1e-4)


def test_profile_names_the_delegates_ops_with_positive_times(exported: tuple[dict[str, Path], torch.nn.Module, np.ndarray]) -> None:
    paths, _, x = exported
    per_op = op_times(paths["int8-dynamic"], x, threads=1, runs=3)
    fc = [op for op in per_op if op.startswith("XNNPACK Fully Connected") and "QC8W" in op]
    assert fc and all(per_op[op] > 0 for op in fc)
    assert not any("layer_norm" in op for op in per_op)
    # the patch embedding is one more fully-connected layer: XNNPACK's convolution ran it at a fifth of that rate
    assert not any("Convolution" in op for op in per_op), per_op


def test_int8_attention_matmuls_run_in_xnnpack_int8_and_agree_with_eager_torch(
        exported: tuple[dict[str, Path], torch.nn.Module, np.ndarray]) -> None:
    """The activation x activation matmuls left float32 by dynamic quantisation ran at float32's rate;
    with calibrated int8 ranges XNNPACK runs them as its int8 batch matmul, and the logits still agree."""
    paths, sub, x = exported
    per_op = op_times(paths["int8-dynamic"], x, threads=1, runs=1)
    bmm = {op for op in per_op if "Batch Matrix Multiply" in op}
    assert bmm == {"XNNPACK Batch Matrix Multiply (NC, QS8) GEMM"}, per_op
    for float_attention in ("fp32", "float-attention"):  # the latter: a profile for CPUs without int8 dot products
        per_op = op_times(paths[float_attention], x, threads=1, runs=1)
        assert {op for op in per_op if "Batch Matrix Multiply" in op} == {"XNNPACK Batch Matrix Multiply (NC, F32) GEMM"}
    with torch.no_grad():
        reference = sub(torch.from_numpy(x)).numpy()[0]
    out = load(paths["int8-dynamic"]).run(x)[0]
    assert float(out @ reference / np.linalg.norm(out) / np.linalg.norm(reference)) > 0.995
