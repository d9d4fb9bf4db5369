"""bench/one_weight_set.py on the digits preset: it runs end to end and its JSON has what docs/benchmarks.md reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the bench end to end

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_writes_bytes_rebuild_load_and_inference_per_variant_and_head_count(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "one_weight_set.py"), "--preset", "digits",
                           "--heads", "3,12", "--variants", "rpi:int8-dynamic,jetson:fp16", "--repeats", "2",
                           "--runs", "2", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "one_weight_set.json").read_text())
    assert report["heads"] == [3, 12] and "int8-relevant flags" in report["host"]
    assert [(v["target"], v["format"], v["quant"]) for v in report["variants"]] == \
        [("rpi", "tflite", "int8-dynamic"), ("jetson", "onnx", "fp16")]
    table = (out / "one_weight_set.md").read_text()
    assert report["host"] in table and "## rpi: tflite int8-dynamic" in table and "## jetson: onnx fp16" in table
    for v in report["variants"]:
        sizes = v["bytes"]
        assert sizes["golden_inputs_files"] == 1
        assert sizes["largest_artefact"] < sizes["compact_bundle"] < sizes["full_bundle"]
        assert sizes["compact_over_largest"] == round(sizes["compact_bundle"] / sizes["largest_artefact"], 3)
        h3, h12 = v["rows"]
        assert (h3["heads"], h3["compact"], h12["heads"], h12["compact"]) == (3, True, 12, False)
        for key in ("rebuild", "rebuilt_load", "dedicated_load"):  # the rebuilt head count: p50 <= p95
            assert 0 < h3[key]["p50_ms"] <= h3[key]["p95_ms"]
        assert h3["rebuild"]["p50_ms"] < h3["rebuilt_load"]["p50_ms"]
        assert h3["stored_bytes"] < h3["artefact_bytes"]
        assert h12["rebuild"] is None and h12["dedicated_load"]["p50_ms"] > 0
        for r in (h3, h12):  # the rebuilt artefact is the dedicated one, byte for byte and output for output
            assert r["inference"]["same_bytes"] and r["inference"]["same_outputs"]
            assert r["inference"]["rebuilt_ms"] > 0 and r["inference"]["dedicated_ms"] > 0
    assert (out / "one_weight_set.png").read_bytes().startswith(b"\x89PNG")
