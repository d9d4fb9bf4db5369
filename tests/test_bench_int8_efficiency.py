"""bench/int8_efficiency.py on a small FC layer and a digits bundle: a rate per runtime, an efficiency per artefact."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_edge import HydraViT
from hydra_edge.model.config import HydraConfig
from hydra_edge.runtime.engines import int8_kernels_saturate, load

pytestmark = pytest.mark.slow  # runs the bench end to end: conversions in every runtime

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_rates_every_runtime_and_each_artefact_against_its_runtime(tmp_path: Path, digits_model: HydraViT) -> None:
    ckpt, out = tmp_path / "digits.pt", tmp_path / "results"
    digits_model.save(ckpt)
    for target in ("rpi", "jetson"):  # jetson's bundle also holds fp16 artefacts, which have no FC rate to meet
        done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", "convert", "-c", str(ckpt), "-t", target, "-o",
                               str(tmp_path / target), "--heads", "3,12", "--layout", "full", "-q"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "int8_efficiency.py"), "--bundles", str(tmp_path / "rpi"),
                           str(tmp_path / "jetson"),
                           "--fc", "17x64x64", "--runs", "3", "--threads", "1", "--batch", "1,2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "int8_efficiency.json").read_text())
    assert report["fc"] == {"shape": "17x64x64", "macs": 17 * 64 * 64} and "int8-relevant flags" in report["host"]
    rates = {r["runtime"]: r for r in report["fc_rates"]}
    rates = {(r["runtime"], r["batch"]): r for r in report["fc_rates"]}
    # an FC rate for each kind of artefact given (no .pte bundle: no ExecuTorch export), and eager torch's
    assert sorted(rates) == [(name, b) for name in ("onnx int8-qdq", "tflite int8-dynamic", "torch fp32") for b in (1, 2)]
    for (_, batch), r in rates.items():  # the rate is the layer's MACs (batch x tokens rows) over its median time
        assert r["gmac_per_s"] > 0 and abs(r["gmac_per_s"] - batch * 17 * 64 * 64 / r["ms"] / 1e6) <= 0.01 * r["gmac_per_s"]
    assert [(a["target"], a["format"], a["quant"], a["heads"], a["batch"]) for a in report["artefacts"]] == \
        [(t, f, q, k, b) for b in (1, 2) for t, f, q in (("rpi", "tflite", "int8-dynamic"), ("jetson", "onnx", "int8-qdq"))
         for k in (3, 12)]
    one = {(a["target"], a["heads"]): a["gmacs"] for a in report["artefacts"] if a["batch"] == 1}
    for a in report["artefacts"]:
        assert a["ms"] > 0 and a["eager_fp32_ms"] > 0 and a["threads"] == 1
        assert a["gmacs"] == pytest.approx(a["batch"] * one[a["target"], a["heads"]], abs=1e-5)  # both rounded to 1e-6
        rate = rates[f"{a['format']} {a['quant']}", a["batch"]]["gmac_per_s"]
        assert abs(a["efficiency"] - a["gmacs"] / (a["ms"] / 1e3) / rate) <= 0.01 * a["efficiency"]
        assert (a["over_largest_latency"] == 1.0) == (a["heads"] == 12) and (a["over_largest_macs"] < 1.0) == (a["heads"] == 3)
    assert report["not_measured"] == ["executorch int8-dynamic (android): no bundle of these artefacts was given (--bundles)"]
    assert sorted(report["profiles"]) == sorted(f"{t} vit_h{k}_{f}_{q}.{s}" for k in (3, 12) for t, f, q, s in
                                                (("rpi", "tflite", "int8-dynamic", "tflite"), ("jetson", "onnx", "int8-qdq", "onnx")))
    for name, ops in report["profiles"].items():  # each runtime's own profile: its op types, with time in them
        assert ops and ops[0]["ms"] > 0 and [o["ms"] for o in ops] == sorted((o["ms"] for o in ops), reverse=True)
        assert len(ops) == 10 or abs(sum(o["share"] for o in ops) - 1) < 0.02  # the top 10, else every op type
        if name.startswith("jetson"):  # onnxruntime's graph as its engine runs it on this CPU: int8 kernels,
            # or where they saturate (x86 without VNNI/AMX) the Q/DQ pairs as written around float products
            assert ({"DequantizeLinear", "MatMul"} if int8_kernels_saturate() else {"QGemm", "QLinearMatMul"}) \
                <= {o["op"] for o in ops}
    assert report["host"] in (out / "int8_efficiency.md").read_text()
    assert (out / "int8_efficiency.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("fmt, quant, target", [("executorch", "int8-dynamic", "android"), ("tflite", "int8-dynamic", "rpi"),
                                                ("onnx", "int8-qdq", "jetson")])
def test_a_batch_of_colour_images_exports_with_each_recipe_and_runs_as_its_eager_batch(
        tmp_path: Path, b16_like: HydraConfig, fmt: str, quant: str, target: str) -> None:
    # Three channels: with one (digits) a channels-last copy of the stacked input has the same bytes,
    # so a program handed the wrong layout still runs and the test would not see it.
    from hydra_edge.profiling.recipes import Stacked, export_with_recipe

    batch = 8
    torch.manual_seed(0)
    sub = HydraViT(b16_like).subnetwork(3).eval()
    x = np.random.default_rng(1).standard_normal((1, batch * 3, 32, 32), dtype=np.float32)
    path = export_with_recipe(Stacked(sub, batch), x, fmt, quant, target, x.shape[1:], tmp_path / f"b{batch}.{fmt}",
                              "test")
    out = load(path, format=fmt).run(x)  # ExecuTorch refused the reshaped batch here: "Propagating input shapes failed"
    with torch.no_grad():
        want = sub(torch.from_numpy(x).reshape(batch, 3, 32, 32)).numpy()  # image i: channels 3i..3i+2
    assert out.shape == (batch, 10)
    # int8 is within 2-4 % of the logits' range here; images in the wrong rows are off by more than 100 %
    assert np.abs(out - want).max() <= 0.1 * np.abs(want).max()


def test_each_timed_run_starts_once_the_previous_runs_threads_have_gone_idle() -> None:
    # like onnxruntime's pool, which keeps a core busy for about 60 ms after an inference returns
    from hydra_edge.profiling.timing import paired_ms

    pool: list[threading.Thread] = []

    def spin() -> None:
        end = time.perf_counter() + 0.15
        while time.perf_counter() < end:
            pass

    def leaves_a_thread_spinning() -> None:
        pool.append(threading.Thread(target=spin))
        pool[-1].start()

    started_beside_it: list[bool] = []
    paired_ms({"spinner": leaves_a_thread_spinning, "next": lambda: started_beside_it.append(pool[-1].is_alive())},
              runs=3, warmup=0)
    assert started_beside_it == [False, False, False]


def test_a_folder_without_a_bundle_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "int8_efficiency.py"), "--bundles", str(tmp_path / "none"),
                           "--fc", "17x64x64", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == f"error: no manifest at {tmp_path / 'none'}; run hydra-edge convert first"
    assert not out.exists()
