"""The conversion pipeline: plan one job per (head count, target variant), skip what is unchanged,
run the rest (in worker processes with ``jobs > 1``), verify each, rewrite the manifest after each.

Everything a user can get wrong (target, heads, checkpoint, data, output folder) is checked before
anything is written. Each artefact is exported to a temporary file, verified there in its own
runtime, and only then renamed into place, so a failed or interrupted artefact leaves nothing.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import queue
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

import msgspec
import numpy as np

from .. import __version__
from ..atomic import atomic_path
from ..errors import HydraEdgeError
from ..runtime.engines import FORMATS, load, runtime_version
from .formats import exporter, tools
from .manifest import MANIFEST, ArtefactRecord, Manifest, intact, read_manifest, sha256_file
from .targets import Variant, load_target
from .verify import EvalSet, eager_logits, golden_tolerance, verify, write_golden

Report = Callable[[str, str, "int | None"], None]  # (artefact file, stage, bytes when done)
TOOLS = ("torch", "executorch", "litert-torch", "ai-edge-litert", "onnx", "onnxruntime", "onnxscript")
RANDOM_BASIS = "random inputs (agreement with fp32 only; no labelled data)"
CALIBRATION_IMAGES = 256  # train-split images handed to static quantisers (they take what they need)
RANDOM_EVAL_IMAGES = 64


@dataclass(frozen=True)
class ConvertOptions:
    """What ``hydra-edge convert`` was asked for."""

    checkpoint: Path
    target: str
    out: Path
    heads: str | None = None  # "3-12" or "3,6,12"; None: every head count the checkpoint serves
    quant: str | None = None  # overrides every variant's quantisation
    max_drop: float = 1.0  # p.p. of top-1 an artefact may lose against its fp32 subnetwork
    jobs: int = 1
    data: str | None = None  # "digits" or a folder; default: the checkpoint's own data spec
    eval_limit: int = 1000  # held-out images verified per artefact
    optional: bool = False  # also convert the target's optional variants
    force: bool = False  # re-convert even unchanged artefacts


@dataclass(frozen=True)
class Job:
    """One artefact to make; plain data so it can be sent to a worker process."""

    checkpoint: str
    checkpoint_sha256: str
    heads: int
    variant: Variant
    file: str
    out: str
    data: dict[str, Any] | None
    eval_limit: int
    golden_inputs: int
    max_drop: float
    threads: int
    fingerprint: str
    device_build: str | None


@dataclass
class ConvertResult:
    manifest: Manifest
    out: Path
    converted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # one line per failed artefact, naming it


def artefact_name(k: int, variant: Variant) -> str:
    """``vit_h6_executorch_int8-dynamic.pte``: the name says what it is."""
    return f"vit_h{k}_{variant.format}_{variant.quant}{FORMATS[variant.format].suffix}"


def golden_name(file: str) -> str:
    return f"{Path(file).stem}.golden.npz"


def tool_versions(names: tuple[str, ...] = TOOLS) -> dict[str, str | None]:
    out: dict[str, str | None] = {"hydra-edge": __version__}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint(ckpt_sha: str, k: int, variant: Variant, data: dict[str, Any] | None,
                eval_limit: int, golden_inputs: int) -> str:
    """Hash of everything that decides an artefact's bytes and its verification record."""
    inputs = {
        "checkpoint": ckpt_sha, "heads": k, "variant": variant.conversion_dict(), "data": data,
        "eval_limit": eval_limit, "golden_inputs": golden_inputs,
        "tools": tool_versions(tools(variant.format)),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------
# Inputs: checkpoint, data, output folder. Checked up front; each failure is one line.


def _evenly(dataset: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples spread over the dataset (folders are sorted by class, so never the first n)."""
    from torch.utils.data import Subset

    from ..data import as_arrays

    idx = np.unique(np.linspace(0, len(dataset) - 1, min(n, len(dataset))).round().astype(int))
    return as_arrays(Subset(dataset, idx.tolist()))


@functools.lru_cache(maxsize=2)
def _context(checkpoint: str, ckpt_sha: str, data_json: str, eval_limit: int) -> tuple[Any, EvalSet, np.ndarray]:
    """Model, evaluation images and calibration images, loaded once per process."""
    from ..checkpoint import load_checkpoint
    from ..data import DataSpec, load_data

    model = load_checkpoint(checkpoint)
    cfg = model.config
    data = json.loads(data_json)
    if data is None:
        rng = np.random.default_rng(0)
        shape = (cfg.in_chans, cfg.img_size, cfg.img_size)
        images = rng.standard_normal((min(eval_limit, RANDOM_EVAL_IMAGES), *shape), dtype=np.float32)
        calibration = rng.standard_normal((CALIBRATION_IMAGES, *shape), dtype=np.float32)
        return model, EvalSet(images, None, RANDOM_BASIS), calibration
    splits = load_data(DataSpec.from_dict(data), cfg)
    images, labels = _evenly(splits.val, eval_limit)
    calibration, _ = _evenly(splits.train, CALIBRATION_IMAGES)
    return model, EvalSet(images, labels, f"held-out split of {data['source']!r}"), calibration


def _data_spec(raw: dict[str, Any], override: str | None) -> dict[str, Any] | None:
    """``--data`` wins, keeping the checkpoint's split seed; else the checkpoint's own spec; else None."""
    from ..data import DataSpec

    spec = raw.get("data") if isinstance(raw.get("data"), dict) else None
    if override is not None:
        base = DataSpec.from_dict(spec) if spec else DataSpec()
        return replace(base, source=override).to_dict()
    return DataSpec.from_dict(spec).to_dict() if spec else None


def _prepare_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HydraEdgeError(f"cannot create output folder {out}: {e.strerror}; choose a writable folder") from None
    if not os.access(out, os.W_OK):
        raise HydraEdgeError(f"output folder {out} is not writable; choose a writable folder")
    for stale in [*out.glob(".vit_h*.tmp"), *out.glob(f".{MANIFEST}.*.tmp")]:
        stale.unlink(missing_ok=True)  # left by a killed run; atomic writes never expose them


# ----------------------------------------------------------------------------------------------
# One job: export -> verify in the device's runtime -> golden pair -> record.


def run_job(job: Job, report: Report) -> ArtefactRecord:
    """Make, verify and record one artefact (in this process); raises HydraEdgeError naming it."""
    import torch

    from ..sizes import subnet_size

    model, evalset, calibration = _context(job.checkpoint, job.checkpoint_sha256, json.dumps(job.data), job.eval_limit)
    fmt, v = job.variant.format, job.variant
    report(job.file, "prepare", None)
    sub = model.subnetwork(job.heads)
    reference = eager_logits(sub, evalset.images)
    for name in exporter(fmt).IMPORTS:
        import_module(name)
    out = Path(job.out)
    path = out / job.file
    with atomic_path(path) as tmp:
        start = time.perf_counter()
        notes = exporter(fmt).export(sub, torch.from_numpy(evalset.images[:1]), v.quant, v.options, calibration,
                                     tmp, lambda stage: report(job.file, stage, None))
        seconds = time.perf_counter() - start
        report(job.file, "verify", None)
        engine = load(tmp, threads=1, format=fmt)
        acc, outputs = verify(engine, reference, evalset, job.max_drop, job.file)
        g = job.golden_inputs
        write_golden(out / golden_name(job.file), evalset.images[:g], reference[:g], outputs[:g])
        size, sha = tmp.stat().st_size, sha256_file(tmp)
    gold = out / golden_name(job.file)
    report(job.file, "done", size)
    cost = subnet_size(model.config, job.heads)
    return ArtefactRecord(
        id=f"h{job.heads}_{v.key}", heads=job.heads, format=fmt, quant=v.quant, file=job.file, bytes=size,
        sha256=sha, params=cost.params, gmacs=round(cost.gmacs, 6), runtime=v.runtime,
        runtime_min_version=v.runtime_min_version, threads=job.threads,
        host_runtime=f"{FORMATS[fmt].runtime} {runtime_version(fmt)}", convert_seconds=round(seconds, 3),
        accuracy=acc, fingerprint=job.fingerprint, device_build=job.device_build, notes=notes,
        golden={"file": gold.name, "sha256": sha256_file(gold), "inputs": int(min(g, len(evalset.images))),
                "reference": "fp32 eager subnetwork", "tolerance": golden_tolerance(outputs[:g], reference[:g])},
    )


def _worker_init(torch_threads: int) -> None:
    import torch

    torch.set_num_threads(torch_threads)


def _run_in_worker(job: Job, reports: Any) -> ArtefactRecord:
    return run_job(job, lambda file, stage, size: reports.put((file, stage, size)))


# ----------------------------------------------------------------------------------------------
# The whole bundle.


@dataclass
class Plan:
    manifest: Manifest  # to update: old records kept when checkpoint and target are unchanged
    jobs: list[Job]  # artefacts to make
    skipped: list[str]  # files whose fingerprint and bytes are unchanged


def plan(opts: ConvertOptions) -> Plan:
    """Check every input, then split the artefacts into jobs to run and records still valid."""
    from ..checkpoint import load_checkpoint_file
    from ..config import parse_heads
    from ..data import DataSpec, load_data

    if opts.max_drop < 0 or opts.jobs < 1 or opts.eval_limit < 1:
        raise HydraEdgeError("--max-drop must be >= 0, --jobs and --eval-limit >= 1")
    target = load_target(opts.target)
    variants = target.variants(opts.quant, opts.optional)
    model, saved = load_checkpoint_file(opts.checkpoint)
    cfg = model.config
    heads = parse_heads(opts.heads, cfg.num_heads) if opts.heads else cfg.heads
    if cfg.separate_heads and set(heads) - set(cfg.heads):
        raise HydraEdgeError(f"{opts.checkpoint} has classifiers only for heads {list(cfg.heads)}; pick --heads among them")
    data = _data_spec(saved, opts.data)
    # fails now, in one line, if the data is gone; its class names let a device label what it sees
    classes = load_data(DataSpec.from_dict(data), cfg).classes if data is not None else None
    _prepare_out(opts.out)
    ckpt_sha = sha256_file(opts.checkpoint)
    old = read_manifest(opts.out) if (opts.out / MANIFEST).is_file() else None
    keep = old is not None and old.checkpoint["sha256"] == ckpt_sha and old.target.get("name") == target.name
    manifest = Manifest(
        checkpoint={"path": str(opts.checkpoint), "sha256": ckpt_sha}, model=cfg.to_dict(), data=data, classes=classes,
        target={**target.to_dict(), "sha256": target.sha256}, tools=tool_versions(), max_drop=opts.max_drop,
        artefacts=list(old.artefacts) if keep and old else [], created_by=f"hydra-edge {__version__}",
    )
    previous = manifest.by_id()
    jobs, skipped = [], []
    for k in heads:
        for v in variants:
            file = artefact_name(k, v)
            fp = fingerprint(ckpt_sha, k, v, data, opts.eval_limit, target.golden_inputs)
            build = v.device_build.format(file=file, engine=f"{Path(file).stem}.engine") if v.device_build else None
            rec = previous.get(f"h{k}_{v.key}")
            within = (rec.accuracy.get("drop_pp") or 0.0) <= opts.max_drop if rec else False  # a stricter --max-drop re-checks
            if rec and within and not opts.force and rec.fingerprint == fp and intact(opts.out, rec):
                # Unchanged bytes; refresh what the profile says about running them.
                manifest.put(msgspec.structs.replace(rec, runtime=v.runtime, runtime_min_version=v.runtime_min_version,
                                                     threads=target.threads, device_build=build))
                skipped.append(file)
                continue
            jobs.append(Job(
                checkpoint=str(opts.checkpoint), checkpoint_sha256=ckpt_sha, heads=k, variant=v, file=file,
                out=str(opts.out), data=data, eval_limit=opts.eval_limit, golden_inputs=target.golden_inputs,
                max_drop=opts.max_drop, threads=target.threads, fingerprint=fp, device_build=build,
            ))
    return Plan(manifest, jobs, skipped)


def _failure(job: Job, error: BaseException) -> str:
    if isinstance(error, HydraEdgeError):
        return str(error) if job.file in str(error) else f"{job.file}: {error}"
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{job.file}: conversion failed ({type(error).__name__}: {first})"


def convert(opts: ConvertOptions, report: Report | None = None) -> ConvertResult:
    """Convert, verify and record every artefact of ``opts``; never raises for one bad artefact.

    Failures are collected (``result.failed``) so that the other head counts still finish; the
    manifest is rewritten after every artefact, so an interrupted run resumes where it stopped.
    """
    report = report or (lambda file, stage, size: None)
    todo = plan(opts)
    manifest, jobs = todo.manifest, todo.jobs
    for file in todo.skipped:
        report(file, "skipped (unchanged)", None)
    result = ConvertResult(manifest=manifest, out=opts.out, skipped=todo.skipped)
    manifest.write(opts.out)

    def finish(job: Job, record: ArtefactRecord | None, error: BaseException | None) -> None:
        if error is not None:
            result.failed.append(_failure(job, error))
            report(job.file, "FAILED", None)
            return
        manifest.put(record)
        manifest.write(opts.out)
        result.converted.append(job.file)

    if opts.jobs == 1 or len(jobs) <= 1:
        for job in jobs:
            try:
                finish(job, run_job(job, report), None)
            except Exception as e:  # one artefact's failure must not stop the others
                finish(job, None, e)
        return result
    _run_parallel(jobs, opts.jobs, report, finish)
    return result


def _run_parallel(jobs: list[Job], n: int, report: Report,
                  finish: Callable[[Job, ArtefactRecord | None, BaseException | None], None]) -> None:
    """Independent head counts in ``n`` spawned processes; stage reports come back over a queue."""
    ctx = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools mid-use
    torch_threads = max(1, (os.cpu_count() or 1) // n)
    with ctx.Manager() as manager:
        reports = manager.Queue()
        with ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init, initargs=(torch_threads,)) as pool:
            futures: dict[Future, Job] = {pool.submit(_run_in_worker, job, reports): job for job in jobs}
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    _drain(reports, report)
                    for future in done:
                        error = future.exception()
                        finish(futures[future], None if error else future.result(), error)
                _drain(reports, report)
            except BaseException:
                for future in pending:
                    future.cancel()
                raise


def _drain(reports: Any, report: Report) -> None:
    while True:
        try:
            report(*reports.get_nowait())
        except queue.Empty:
            return
