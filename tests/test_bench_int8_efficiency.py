"""bench/int8_efficiency.py on a small FC layer and a digits bundle: a rate per runtime, an efficiency per artefact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hydra_edge import HydraViT

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_rates_every_runtime_and_each_artefact_against_its_runtime(tmp_path: Path, digits_model: HydraViT) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ckpt, bundle, out = tmp_path / "digits.pt", tmp_path / "rpi", tmp_path / "results"
    digits_model.save(ckpt)
    done = subprocess.run([sys.executable, "-m", "hydra_edge.cli", "convert", "-c", str(ckpt), "-t", "rpi", "-o",
                           str(bundle), "--heads", "3,12", "--layout", "full"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "int8_efficiency.py"), "--bundles", str(bundle),
                           "--fc", "17x64x64", "--runs", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "int8_efficiency.json").read_text())
    assert report["fc"] == {"shape": "17x64x64", "macs": 17 * 64 * 64} and "int8-relevant flags" in report["host"]
    rates = {r["runtime"]: r for r in report["fc_rates"]}
    assert sorted(rates) == ["executorch int8-dynamic", "onnx int8-qdq", "tflite int8-dynamic", "torch fp32"]
    for r in rates.values():  # the rate is the layer's MACs over its median time
        assert r["gmac_per_s"] > 0 and abs(r["gmac_per_s"] - 17 * 64 * 64 / r["ms"] / 1e6) <= 0.05 + 0.01 * r["gmac_per_s"]
    h3, h12 = sorted(report["artefacts"], key=lambda a: a["heads"])
    assert (h3["heads"], h3["format"], h3["threads"], h12["heads"]) == (3, "tflite", 1, 12)
    for a in (h3, h12):
        assert a["ms"] > 0 and a["eager_fp32_ms"] > 0
        rate = rates["tflite int8-dynamic"]["gmac_per_s"]
        assert abs(a["efficiency"] - a["gmacs"] / (a["ms"] / 1e3) / rate) <= 0.01 * a["efficiency"] + 1e-3
    assert h12["over_largest_latency"] == 1.0 and h3["over_largest_macs"] < 1.0
    assert report["not_measured"] == ["executorch int8-dynamic (android): no bundle of these artefacts was given (--bundles)",
                                      "onnx int8-qdq (jetson): no bundle of these artefacts was given (--bundles)"]
    assert report["host"] in (out / "int8_efficiency.md").read_text()
    assert (out / "int8_efficiency.png").read_bytes().startswith(b"\x89PNG")
