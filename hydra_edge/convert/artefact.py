"""One artefact, in this process: export to a temporary file -> verify it in the device's runtime ->
golden pair -> record, then rename it into place; so a failed or interrupted artefact leaves nothing."""

from __future__ import annotations

import functools
import time
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..atomic import atomic_path, sha256_file
from ..errors import HydraEdgeError
from ..formats import FORMATS
from ..logs import artefact_log, capture
from ..model.slicing import weight_index
from ..records.manifest import ArtefactRecord
from ..runtime.engines import load, runtime_version
from .formats import exporter
from .golden import golden_name
from .inputs import context
from .nesting import Ranges, nested_ranges
from .options import Report
from .plan import Job
from .verify import golden_tolerance, verify, write_golden


def run_job(job: Job, report: Report, commit: Callable[[], None] = lambda: None) -> ArtefactRecord:
    """``_run_job`` with the converters' and runtimes' own output in the artefact's log."""
    with capture(artefact_log(Path(job.out), job.file), f"hydra-edge {__version__}: {job.file}"):
        return _run_job(job, report, commit)


def _run_job(job: Job, report: Report, commit: Callable[[], None]) -> ArtefactRecord:
    """Make, verify and record one artefact (in this process); raises HydraEdgeError naming it.

    ``commit`` is called once the artefact is verified and its record complete, just before it is
    renamed into place: from there on an interrupt must wait until the record is kept too.
    """
    import torch

    from ..model.sizes import subnet_size

    model, evalset, calibration = context(*job.context_key())
    fmt, v, reference, nesting = job.variant.format, job.variant, job.reference, job.nesting
    assert reference is not None, "share_references sets every job's reference before it runs"
    report(job.shown, "prepare", None)
    sub = model.subnetwork(job.heads)
    # nesting costs too much where not nested: quantise on its own
    ranges = weight_ranges(model, job.heads) if nesting is not None and nesting.nested else None
    for name in exporter(fmt).IMPORTS:
        import_module(name)
    out = Path(job.out)
    gold = out / golden_name(job.file)
    with atomic_path(out / job.file) as tmp:
        start = time.perf_counter()
        notes = exporter(fmt).export(sub, torch.from_numpy(evalset.images[:1]), v.quant, v.options, calibration,
                                     tmp, lambda stage: report(job.shown, stage, None),
                                     ranges=ranges)
        seconds = time.perf_counter() - start
        report(job.shown, "verify", None)
        start = time.perf_counter()
        engine = load(tmp, threads=job.verify_threads, format=fmt)
        acc, outputs = verify(engine, reference, evalset, job.max_drop, job.file)
        verify_seconds = time.perf_counter() - start
        g = job.golden_inputs
        write_golden(gold, evalset.images[:g], reference[:g], outputs[:g])
        cost = subnet_size(model.config, job.heads)
        record = ArtefactRecord(
            id=f"h{job.heads}_{v.key}", heads=job.heads, format=fmt, quant=v.quant, file=job.file,
            bytes=tmp.stat().st_size, sha256=sha256_file(tmp), params=cost.params, gmacs=round(cost.gmacs, 6),
            runtime=v.runtime, runtime_min_version=v.runtime_min_version, threads=job.threads,
            host_runtime=f"{FORMATS[fmt].runtime} {runtime_version(fmt)}", convert_seconds=round(seconds, 3),
            verify_seconds=round(verify_seconds, 3),
            accuracy=acc, fingerprint=job.fingerprint, device_build=job.device_build, notes=notes,
            nesting=nesting,
            golden={"file": gold.name, "sha256": sha256_file(gold), "inputs": int(min(g, len(evalset.images))),
                    "reference": "fp32 eager subnetwork", "tolerance": golden_tolerance(outputs[:g], reference[:g])},
        )
        commit()
    report(job.shown, "done", record.bytes)
    return record


def weight_ranges(model: Any, k: int) -> Ranges:
    """Weight ranges of the largest head count, sliced to ``k`` heads (what nested int8 weights use)."""
    return nested_ranges(model.named_parameters(), k, functools.partial(weight_index, cfg=model.config, k=k))


def failure(job: Job, error: BaseException) -> str:
    """One line naming the artefact (``<target>/<file>`` with several targets), what failed, and its log."""
    log = f"; converter output: {artefact_log(Path(job.out), job.file)}"
    target = job.shown[: -len(job.file)]
    if isinstance(error, HydraEdgeError):
        return target + (str(error) if job.file in str(error) else f"{job.file}: {error}") + log
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{job.shown}: conversion failed ({type(error).__name__}: {first})" + log
