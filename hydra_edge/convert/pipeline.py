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
import signal
import threading
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
from ..config import HydraConfig
from ..errors import HydraEdgeError
from ..lock import exclusive
from ..logs import artefact_log, capture
from ..runtime.engines import FORMATS, load, runtime_version
from ..slicing import weight_index
from .formats import all_tools, exporter, tools
from .golden import golden_name
from .layout import LAYOUTS, apply_layout
from .manifest import MANIFEST, ArtefactRecord, Manifest, intact, read_manifest, sha256_file
from .nesting import max_cost, measure, nested_ranges
from .targets import Target, Variant, load_target
from .verify import EvalSet, eager_logits, golden_tolerance, verify, write_golden

Report = Callable[[str, str, "int | None"], None]  # (artefact file, stage, bytes when done)
RANDOM_BASIS = "random inputs (agreement with fp32 only; no labelled data)"
CALIBRATION_IMAGES = 256  # train-split images handed to static quantisers (they take what they need)
RANDOM_EVAL_IMAGES = 64
LOCK = ".lock"  # in the bundle folder: one conversion at a time per bundle


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
    wait: bool = True  # wait while another run holds the bundle (else stop, naming it)
    layout: str = "compact"  # one weight set per variant (convert.layout); "full": a file per artefact
    ema: bool = True  # the checkpoint's EMA weights when it has them (checkpoint.weights_entry)


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
    ema: bool = True  # resolved: True only when the file has EMA weights and they were asked for


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


def tool_versions(names: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """Installed versions of ``names`` (default: every format's tools), with hydra-edge's own."""
    out: dict[str, str | None] = {"hydra-edge": __version__}
    for name in all_tools() if names is None else names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint(ckpt_sha: str, k: int, variant: Variant, data: dict[str, Any] | None,
                eval_limit: int, golden_inputs: int, weights: str) -> str:
    """Hash of everything that decides an artefact's bytes and its verification record."""
    inputs = {
        "checkpoint": ckpt_sha, "weights": weights, "heads": k, "variant": variant.conversion_dict(), "data": data,
        "eval_limit": eval_limit, "golden_inputs": golden_inputs,
        "tools": tool_versions(tools(variant.format)),
        "quantisation": "nested",  # int8 weights quantised with the largest head count's ranges (convert.nesting)
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
def _context(checkpoint: str, ckpt_sha: str, data_json: str, eval_limit: int,
             ema: bool) -> tuple[Any, EvalSet, np.ndarray]:
    """Model, evaluation images and calibration images, loaded once per process."""
    from ..checkpoint import load_checkpoint
    from ..data import DataSpec, load_data

    model = load_checkpoint(checkpoint, ema=ema)
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


def _remove_stale(out: Path) -> None:
    """Temp files of a killed run (atomic writes never expose them); call with the bundle locked."""
    for stale in [*out.glob(".vit_h*.tmp"), *out.glob(f".{MANIFEST}.*.tmp")]:
        stale.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# One job: export -> verify in the device's runtime -> golden pair -> record.


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

    from ..sizes import subnet_size

    model, evalset, calibration = _context(job.checkpoint, job.checkpoint_sha256, json.dumps(job.data), job.eval_limit,
                                         job.ema)
    fmt, v = job.variant.format, job.variant
    report(job.file, "prepare", None)
    sub = model.subnetwork(job.heads)
    reference = eager_logits(sub, evalset.images)
    ranges, nesting = None, None
    if v.quant in exporter(fmt).NESTED:
        report(job.file, "measure nesting", None)
        limit = max_cost(v.options)
        ranges = nested_ranges(model.named_parameters(), job.heads,
                               functools.partial(weight_index, cfg=model.config, k=job.heads))
        nesting = measure(sub, ranges, evalset, reference, limit)
        ranges = ranges if nesting.nested else None  # nesting costs too much here: quantise on its own
    for name in exporter(fmt).IMPORTS:
        import_module(name)
    out = Path(job.out)
    gold = out / golden_name(job.file)
    with atomic_path(out / job.file) as tmp:
        start = time.perf_counter()
        notes = exporter(fmt).export(sub, torch.from_numpy(evalset.images[:1]), v.quant, v.options, calibration,
                                     tmp, lambda stage: report(job.file, stage, None),
                                     ranges=ranges)
        seconds = time.perf_counter() - start
        report(job.file, "verify", None)
        engine = load(tmp, threads=1, format=fmt)
        acc, outputs = verify(engine, reference, evalset, job.max_drop, job.file)
        g = job.golden_inputs
        write_golden(gold, evalset.images[:g], reference[:g], outputs[:g])
        cost = subnet_size(model.config, job.heads)
        record = ArtefactRecord(
            id=f"h{job.heads}_{v.key}", heads=job.heads, format=fmt, quant=v.quant, file=job.file,
            bytes=tmp.stat().st_size, sha256=sha256_file(tmp), params=cost.params, gmacs=round(cost.gmacs, 6),
            runtime=v.runtime, runtime_min_version=v.runtime_min_version, threads=job.threads,
            host_runtime=f"{FORMATS[fmt].runtime} {runtime_version(fmt)}", convert_seconds=round(seconds, 3),
            accuracy=acc, fingerprint=job.fingerprint, device_build=job.device_build, notes=notes,
            nesting=nesting,
            golden={"file": gold.name, "sha256": sha256_file(gold), "inputs": int(min(g, len(evalset.images))),
                    "reference": "fp32 eager subnetwork", "tolerance": golden_tolerance(outputs[:g], reference[:g])},
        )
        commit()
    report(job.file, "done", record.bytes)
    return record


class _Commit:
    """Ctrl-C between an artefact's rename and its manifest record would leave a file the manifest
    does not list; from ``hold()`` to the end of the block, SIGINT is noted instead and acted on
    after (``then``: by default KeyboardInterrupt). Before ``hold()`` it interrupts as usual, and
    the artefact's temporary file is removed."""

    def __init__(self, then: Callable[[], None] | None = None) -> None:
        self.interrupted = False
        self._then = then
        self._previous: Any = None

    def hold(self) -> None:
        if threading.current_thread() is threading.main_thread() and self._previous is None:
            self._previous = signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def __enter__(self) -> "_Commit":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self.interrupted and exc[0] is None:
            (self._then or _raise_interrupt)()


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


class _Worker:
    """A conversion worker process's state. SIGINT (Ctrl-C reaches the whole process group; the
    parent relays it through ``stop`` otherwise) interrupts the artefact being made, or, while the
    worker is idle or committing, makes it refuse further artefacts."""

    reports: Any = None
    busy = False
    stopping = False

    @classmethod
    def on_sigint(cls, signum: int, frame: Any) -> None:
        cls.stopping = True
        if cls.busy:
            raise KeyboardInterrupt

    @classmethod
    def stop(cls) -> None:
        cls.stopping = True


def _relay(stop: Any) -> None:
    """Turn the parent's ``stop`` event into this worker's own SIGINT."""
    stop.wait()
    os.kill(os.getpid(), signal.SIGINT)


def _worker_init(torch_threads: int, reports: Any, stop: Any) -> None:
    signal.signal(signal.SIGINT, _Worker.on_sigint)
    _Worker.reports = reports
    threading.Thread(target=_relay, args=(stop,), daemon=True).start()
    import torch

    torch.set_num_threads(torch_threads)


def _run_in_worker(job: Job) -> ArtefactRecord:
    with _Commit(then=_Worker.stop) as commit:
        _Worker.busy = True
        try:
            if _Worker.stopping:
                raise KeyboardInterrupt
            return run_job(job, lambda file, stage, size: _Worker.reports.put((file, stage, size)), commit.hold)
        finally:
            _Worker.busy = False


# ----------------------------------------------------------------------------------------------
# The whole bundle.


@dataclass
class Plan:
    manifest: Manifest  # to update: old records kept when checkpoint and target are unchanged
    jobs: list[Job]  # artefacts to make
    skipped: list[str]  # files whose fingerprint and bytes are unchanged


@dataclass(frozen=True)
class Inputs:
    """What ``opts`` names, loaded and checked; nothing is written before all of it is."""

    target: Target
    variants: tuple[Variant, ...]
    config: HydraConfig
    heads: tuple[int, ...]
    data: dict[str, Any] | None
    classes: list[str] | None
    weights: str  # the checkpoint's entry converted (checkpoint.weights_entry)


def check_inputs(opts: ConvertOptions) -> Inputs:
    """Load and check every input; each mistake is one line, raised before anything is written."""
    from ..checkpoint import load_checkpoint_file, weights_entry
    from ..config import parse_heads
    from ..data import DataSpec, load_data

    if opts.max_drop < 0 or opts.jobs < 1 or opts.eval_limit < 1:
        raise HydraEdgeError("--max-drop must be >= 0, --jobs and --eval-limit >= 1")
    if opts.layout not in LAYOUTS:
        raise HydraEdgeError(f"unknown --layout {opts.layout!r}; choose one of {', '.join(LAYOUTS)}")
    target = load_target(opts.target)
    variants = target.variants(opts.quant, opts.optional)
    for v in variants:
        if v.quant in exporter(v.format).NESTED:
            max_cost(v.options, f"{target.source}: {v.key}")
    model, saved = load_checkpoint_file(opts.checkpoint, ema=opts.ema)
    cfg = model.config
    heads = parse_heads(opts.heads, cfg.num_heads) if opts.heads else cfg.heads
    if cfg.separate_heads and set(heads) - set(cfg.heads):
        raise HydraEdgeError(f"{opts.checkpoint} has classifiers only for heads {list(cfg.heads)}; pick --heads among them")
    data = _data_spec(saved, opts.data)
    # fails now, in one line, if the data is gone; its class names let a device label what it sees
    classes = load_data(DataSpec.from_dict(data), cfg).classes if data is not None else None
    return Inputs(target, variants, cfg, tuple(heads), data, classes, weights_entry(saved, opts.ema))


def plan(opts: ConvertOptions, inputs: Inputs) -> Plan:
    """Split the artefacts into jobs to run and records still valid (call with the bundle locked)."""
    from ..checkpoint import EMA_ENTRIES

    target, cfg, data = inputs.target, inputs.config, inputs.data
    ckpt_sha = sha256_file(opts.checkpoint)
    old = read_manifest(opts.out) if (opts.out / MANIFEST).is_file() else None
    keep = (old is not None and old.checkpoint["sha256"] == ckpt_sha and old.target.get("name") == target.name
            and old.checkpoint.get("weights", "state_dict") == inputs.weights)
    manifest = Manifest(
        checkpoint={"path": str(opts.checkpoint), "sha256": ckpt_sha, "weights": inputs.weights}, model=cfg.to_dict(), data=data,
        classes=inputs.classes, target={**target.to_dict(), "sha256": target.sha256}, tools=tool_versions(),
        max_drop=opts.max_drop, artefacts=list(old.artefacts) if keep and old else [],
        created_by=f"hydra-edge {__version__}",
    )
    previous = manifest.by_id()
    jobs, skipped = [], []
    for k in inputs.heads:
        for v in inputs.variants:
            file = artefact_name(k, v)
            fp = fingerprint(ckpt_sha, k, v, data, opts.eval_limit, target.golden_inputs, inputs.weights)
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
                ema=inputs.weights in EMA_ENTRIES,
            ))
    return Plan(manifest, jobs, skipped)


def _failure(job: Job, error: BaseException) -> str:
    log = f"; converter output: {artefact_log(Path(job.out), job.file)}"
    if isinstance(error, HydraEdgeError):
        return (str(error) if job.file in str(error) else f"{job.file}: {error}") + log
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{job.file}: conversion failed ({type(error).__name__}: {first})" + log


def convert(opts: ConvertOptions, report: Report | None = None) -> ConvertResult:
    """Convert, verify and record every artefact of ``opts``; never raises for one bad artefact.

    Failures are collected (``result.failed``) so that the other head counts still finish; the
    manifest is rewritten after every artefact, so an interrupted run resumes where it stopped.
    One run at a time per bundle: a second waits for the lock (or, with ``wait=False``, stops
    with the holder's name).
    """
    from ..checkpoint import EMA_ENTRIES

    report = report or (lambda file, stage, size: None)
    inputs = check_inputs(opts)
    _prepare_out(opts.out)
    with exclusive(opts.out / LOCK, f"bundle {opts.out}", opts.wait):
        _remove_stale(opts.out)
        result = _convert(opts, plan(opts, inputs), report)
        apply_layout(opts.out, result.manifest, opts.layout, str(opts.checkpoint), report,
                     ema=inputs.weights in EMA_ENTRIES)
        return result


def _convert(opts: ConvertOptions, todo: Plan, report: Report) -> ConvertResult:
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
            with _Commit() as commit:
                try:
                    record = run_job(job, report, commit.hold)
                except Exception as e:  # one artefact's failure must not stop the others
                    finish(job, None, e)
                else:
                    finish(job, record, None)
        return result
    _run_parallel(jobs, opts.jobs, report, finish)
    return result


def _run_parallel(jobs: list[Job], n: int, report: Report,
                  finish: Callable[[Job, ArtefactRecord | None, BaseException | None], None]) -> None:
    """Independent head counts in ``n`` spawned processes; stage reports come back over a queue.

    On Ctrl-C the workers stop (an artefact being made is dropped, one being renamed into place
    is finished) and every artefact that did finish is recorded before the interrupt goes on.
    """
    ctx = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools mid-use
    torch_threads = max(1, (os.cpu_count() or 1) // n)
    reports, stop = ctx.Queue(), ctx.Event()
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                             initargs=(torch_threads, reports, stop)) as pool:
        futures: dict[Future, Job] = {pool.submit(_run_in_worker, job): job for job in jobs}
        recorded: set[Future] = set()

        def record_finished() -> None:
            for future, job in futures.items():
                if future.done() and not future.cancelled() and future not in recorded:
                    recorded.add(future)
                    error = future.exception()
                    if not isinstance(error, KeyboardInterrupt):  # stopped by Ctrl-C: not a failure
                        finish(job, None if error else future.result(), error)

        try:
            while len(recorded) < len(futures):
                wait(set(futures) - recorded, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(reports, report)
                with _Commit() as commit:
                    commit.hold()
                    record_finished()
        except KeyboardInterrupt:
            with _Commit() as commit:  # a second Ctrl-C must not lose what the workers finished
                commit.hold()
                stop.set()
                for future in futures:
                    future.cancel()
                wait(futures)
                _drain(reports, report)
                record_finished()
            raise


def _drain(reports: Any, report: Report) -> None:
    while True:
        try:
            report(*reports.get_nowait())
        except queue.Empty:
            return
