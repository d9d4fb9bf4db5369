"""bench/switch_latency.py on the digits preset: one run times compact and full bundles, with and without prefetch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the bench end to end

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_times_switches_on_compact_and_full_bundles_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "switch_latency.py"), "--preset", "digits",
                           "--heads", "3,6,12", "--trials", "6", "--runs", "3", "--work", str(tmp_path / "work"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "switch_latency_digits.json").read_text())
    assert report["heads"] == [3, 6, 12] and report["format"] == "onnx" and report["compact_heads"] == [3, 6]
    assert [(r["layout"], r["prefetch"]) for r in report["rows"]] == \
        [("full", True), ("full", False), ("compact", True), ("compact", False)]
    for r in report["rows"]:  # every trial switched to the head count its band picks (the bench checks each)
        assert r["trials"] == 6 and 0 < r["p50_ms"] <= r["p95_ms"] <= r["max_ms"]
        assert r["overhead_p50_ms"] <= r["overhead_p95_ms"] < r["max_ms"]
    assert {c["heads"] for c in report["candidates"]} <= {3, 6, 12} and len(report["candidates"]) >= 2
    table = (out / "switch_latency_digits.md").read_text()
    assert report["host"] in table and "| compact | prefetch |" in table and "| full | no prefetch |" in table
    assert (out / "switch_latency_digits.png").read_bytes().startswith(b"\x89PNG")
