"""ExecuTorch's own profiler (ETDump, read by the devtools Inspector), summed by op type.

The runtime records every instruction it runs (a portable kernel, or a call into a delegate) and the
XNNPACK delegate records each of its operators inside that call. Summed by type, with what lies
between them named as overhead, so that the types add up to the method's whole time:

- ``XNNPACK <operator>``: an XNNPACK operator inside a delegate call (e.g. ``XNNPACK Fully Connected
  (NC, QDU8, F32, QC8W) GEMM``);
- ``<kernel>``: an op left outside the delegate, run by a portable kernel (e.g. ``native_layer_norm.out``);
- ``XNNPACK delegate call, outside its operators``: the delegate's own cost per call (setting up the
  runtime's inputs and outputs, converting between delegates);
- ``operator dispatch``: the runtime's cost per portable kernel call, outside the kernel;
- ``method, outside its instructions``: the rest of ``Method::execute``.

Each op type's time is its median over the runs (of its total per run), not the mean: on a shared
host one preempted run adds milliseconds to whichever op it hit, and a mean of a few runs then
names the wrong op.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

DELEGATE_OVERHEAD = "XNNPACK delegate call, outside its operators"
DISPATCH = "operator dispatch"
METHOD = "method, outside its instructions"
_WARMUP = 1  # the first run allocates XNNPACK's workspaces and packs nothing twice: not a steady inference


def op_times(path: Path, x: np.ndarray, threads: int, runs: int) -> dict[str, float]:
    """ms per inference spent in each op type of a ``.pte`` (median of ``runs``), ``threads`` threads, after one warm-up run."""
    import torch
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    _unsafe_reset_threadpool(threads)
    program = Runtime.get().load_program(str(path), enable_etdump=True)
    method = program.load_method("forward")
    inputs = [torch.from_numpy(np.ascontiguousarray(x))]
    for _ in range(_WARMUP + runs):
        method.execute(inputs)
    with tempfile.TemporaryDirectory(prefix="hydra-etdump-") as tmp:
        etdump = Path(tmp) / "profile.etdp"
        program.write_etdump_result_to_file(str(etdump), str(Path(tmp) / "debug.bin"))
        blocks = Inspector(etdump_path=str(etdump)).event_blocks
    per_run: list[dict[str, float]] = [{} for _ in range(runs)]  # event type -> ms, summed over its instances
    for event in (e for block in blocks if block.name == "Execute" for e in block.events):
        raw = event.perf_data.raw if event.perf_data else []
        if len(raw) != _WARMUP + runs:
            raise RuntimeError(f"{path}: ETDump has {len(raw)} timings of {event.name!r}, expected {_WARMUP + runs}")
        # an XNNPACK operator is numbered within its delegate call ("... GEMM #2"); a portable kernel
        # is "native_call_<kernel>"; the rest are the runtime's wrappers (DELEGATE_CALL, OPERATOR_CALL, ...)
        kind = ("XNNPACK " + re.sub(r" #\d+$", "", event.name) if event.is_delegated_op
                else event.name.removeprefix("native_call_"))
        for totals, ms in zip(per_run, raw[_WARMUP:]):
            totals[kind] = totals.get(kind, 0.0) + float(ms)
    by_type = [_by_type(totals) for totals in per_run]
    return {op: float(np.median([run[op] for run in by_type])) for op in by_type[0]}


def _by_type(totals: dict[str, float]) -> dict[str, float]:
    """One run's ms by event type, the runtime's wrapper events turned into the overheads around what they wrap."""
    per_op = dict(totals)
    delegate_calls = per_op.pop("DELEGATE_CALL", 0.0)
    operator_calls = per_op.pop("OPERATOR_CALL", 0.0)
    method = per_op.pop("Method::execute", 0.0)
    delegated = sum(ms for op, ms in per_op.items() if op.startswith("XNNPACK "))
    portable = sum(per_op.values()) - delegated
    per_op[DELEGATE_OVERHEAD] = delegate_calls - delegated
    per_op[DISPATCH] = operator_calls - portable
    per_op[METHOD] = method - delegate_calls - operator_calls
    return per_op
