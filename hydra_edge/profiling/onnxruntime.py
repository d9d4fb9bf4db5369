"""onnxruntime's own per-node profiler, summed by op type: where an ONNX artefact's time goes."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np


def op_times(path: Path, x: np.ndarray, threads: int, runs: int) -> dict[str, float]:
    """ms per inference spent in each op type (kernel time only), ``threads`` intra-op threads.

    Each node's time is its median over ``runs`` inferences (a shared host pre-empts single kernels,
    and one pre-emption inflates a mean by milliseconds), then summed over the nodes of each op type.
    """
    import onnxruntime as ort

    from hydra_edge.runtime.engines import onnx_session_options

    options = onnx_session_options(threads)  # the engine's own: the graph it runs on this CPU
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="hydra-ort-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        for _ in range(runs):
            session.run(None, {name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    per_node: dict[str, tuple[str, list[float]]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node.setdefault(e["name"], (e["args"]["op_name"], []))[1].append(e["dur"] / 1e3)
    per_op: dict[str, float] = {}
    for op, times in per_node.values():
        per_op[op] = per_op.get(op, 0.0) + statistics.median(times)
    return per_op
