"""bench/one_weight_set.py on the digits preset: it runs end to end and its JSON has what the README table needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_writes_bytes_rebuild_load_and_inference_per_head_count(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "one_weight_set.py"), "--preset", "digits",
                           "--heads", "3,6,12", "--repeats", "2", "--runs", "2", "--work", str(tmp_path / "work"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "one_weight_set.json").read_text())
    assert report["heads"] == [3, 6, 12] and report["format"] == "onnx" and "int8-relevant flags" in report["host"]
    sizes = report["bytes"]
    assert sizes["golden_inputs_files"] == 1
    assert sizes["largest_artefact"] < sizes["compact_bundle"] < sizes["full_bundle"]
    assert sizes["compact_over_largest"] == round(sizes["compact_bundle"] / sizes["largest_artefact"], 3)
    rows = {r["heads"]: r for r in report["rows"]}
    assert [rows[k]["compact"] for k in (3, 6, 12)] == [True, True, False]
    for k in (3, 6):  # rebuilt head counts: every measurement, p50 <= p95
        for key in ("rebuild", "rebuilt_load", "dedicated_load"):
            assert 0 < rows[k][key]["p50_ms"] <= rows[k][key]["p95_ms"]
        assert rows[k]["rebuild"]["p50_ms"] < rows[k]["rebuilt_load"]["p50_ms"]
        assert rows[k]["stored_bytes"] < rows[k]["artefact_bytes"]
    assert rows[12]["rebuild"] is None and rows[12]["dedicated_load"]["p50_ms"] > 0
    for r in rows.values():  # the rebuilt artefact is the dedicated one, byte for byte and output for output
        assert r["inference"]["same_bytes"] and r["inference"]["same_outputs"]
        assert r["inference"]["rebuilt_ms"] > 0 and r["inference"]["dedicated_ms"] > 0
    table = (out / "one_weight_set.md").read_text()
    assert report["host"] in table and "| 3 |" in table and "## Goals" in table
    assert (out / "one_weight_set.png").read_bytes().startswith(b"\x89PNG")
