"""onnxruntime's own per-node profiler, summed by op type: where an ONNX artefact's time goes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np


def op_times(path: Path, x: np.ndarray, threads: int, runs: int) -> dict[str, float]:
    """Mean ms per inference spent in each op type (kernel time only), ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="hydra-ort-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        for _ in range(runs):
            session.run(None, {name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    per_op: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] = per_op.get(e["args"]["op_name"], 0.0) + e["dur"] / 1e3 / runs
    return per_op
