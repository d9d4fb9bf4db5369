"""The conversion pipeline: plan one job per (head count, target variant), skip what is unchanged,
run the rest (in worker processes with ``jobs > 1``), verify each, rewrite the manifest after each.

Several targets convert in one run, one bundle each, sharing what does not depend on the target:
each head count's fp32 reference logits and nesting measurement are computed once, batched, with
every core, before any artefact, and the same warm workers make every target's artefacts.

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
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Sequence

import msgspec
import numpy as np

from .. import __version__
from ..atomic import atomic_path, sha256_file
from ..errors import HydraEdgeError
from ..lock import exclusive
from ..logs import LOGS, artefact_log, capture
from ..model.config import HydraConfig
from ..model.slicing import weight_index
from ..records.manifest import LOCK, MANIFEST, ArtefactRecord, Manifest, Nesting, intact, read_manifest
from ..runtime.engines import FORMATS, load, runtime_version
from .attention import attention_matmuls
from .formats import all_tools, exporter, tools
from .golden import golden_name
from .layout import LAYOUTS, apply_layout
from .nesting import max_cost, measure, nested_ranges
from .targets import Target, Variant, load_target
from .verify import EvalSet, eager_logits, golden_tolerance, verify, write_golden
from .workers import choose_jobs, cores, peak_rss_bytes

Report = Callable[[str, str, "int | None"], None]  # (artefact file, stage, bytes when done)
Note = Callable[[str], None]  # one line about the whole run (workers chosen, references computed)
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
    jobs: int | None = None  # None: as many as cores and memory allow (convert.workers)
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
    shown: str = ""  # the name progress reports use: ``file``, or ``<target>/<file>`` with several targets
    verify_threads: int = 1  # runtime threads verifying it: the cores its process has
    # Shared by every variant and target of the head count (``share_references``), set before it runs:
    reference: np.ndarray | None = field(default=None, compare=False, repr=False)  # fp32 logits on the eval set
    nesting: Nesting | None = None  # measured when the variant's quant is nested, else None


@dataclass
class ConvertResult:
    manifest: Manifest
    out: Path
    converted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # one line per failed artefact, naming it
    # The whole run's (equal for every target converted together):
    jobs: int = 1  # worker processes used
    reference_seconds: float = 0.0  # fp32 references and nesting measurements, each head count once
    peak_worker_bytes: int = 0  # largest peak resident memory of a process that made artefacts


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

    from ..train.data import as_arrays

    idx = np.unique(np.linspace(0, len(dataset) - 1, min(n, len(dataset))).round().astype(int))
    return as_arrays(Subset(dataset, idx.tolist()))


@functools.lru_cache(maxsize=2)
def _context(checkpoint: str, ckpt_sha: str, data_json: str, eval_limit: int,
             ema: bool) -> tuple[Any, EvalSet, np.ndarray]:
    """Model, evaluation images and calibration images, loaded once per process."""
    from ..model.checkpoint import load_checkpoint
    from ..train.data import DataSpec, load_data

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
    from ..train.data import DataSpec

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
    """Temp files of a killed or interrupted run (atomic writes never expose them); call with the
    bundle locked and no worker running."""
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

    from ..model.sizes import subnet_size

    model, evalset, calibration = _context(*_context_key(job))
    fmt, v, reference, nesting = job.variant.format, job.variant, job.reference, job.nesting
    assert reference is not None, "share_references sets every job's reference before it runs"
    report(job.shown, "prepare", None)
    sub = model.subnetwork(job.heads)
    # nesting costs too much where not nested: quantise on its own
    ranges = _ranges(model, job.heads) if nesting is not None and nesting.nested else None
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


def _context_key(job: Job) -> tuple[str, str, str, int, bool]:
    """What ``_context`` loads for ``job``: equal for every job of one checkpoint, data and eval set."""
    return job.checkpoint, job.checkpoint_sha256, json.dumps(job.data), job.eval_limit, job.ema


def _ranges(model: Any, k: int) -> Any:
    """Weight ranges of the largest head count, sliced to ``k`` heads (what nested int8 weights use)."""
    return nested_ranges(model.named_parameters(), k, functools.partial(weight_index, cfg=model.config, k=k))


def share_references(jobs: Sequence[Job], report: Report) -> list[Job]:
    """``jobs`` with their head count's fp32 reference logits and nesting measurement, each computed
    once, batched, in this process (every core), however many variants and targets share it.

    They depend only on the checkpoint, its weights entry, the evaluation images and the head count
    (nesting also on the variant's cost bound), so computing them per artefact repeated the same
    eager passes, up to three per artefact. What the libraries print meanwhile (torchao's import
    notes, for one) goes to the first bundle's ``logs/references.log``.
    """
    if not jobs:
        return []
    with capture(Path(jobs[0].out) / LOGS / "references.log", f"hydra-edge {__version__}: fp32 references, nesting"):
        return _share_references(jobs, report)


def _share_references(jobs: Sequence[Job], report: Report) -> list[Job]:
    references: dict[tuple[Any, ...], np.ndarray] = {}
    nestings: dict[tuple[Any, ...], Nesting] = {}
    shared = []
    for job in jobs:
        model, evalset, _ = _context(*_context_key(job))
        key = (*_context_key(job), job.heads)
        if key not in references:
            report(job.shown, f"fp32 reference, {job.heads} heads", None)
            references[key] = eager_logits(model.subnetwork(job.heads), evalset.images)
        nesting = None
        if job.variant.quant in exporter(job.variant.format).NESTED:
            limit = max_cost(job.variant.options)
            if (*key, limit) not in nestings:
                report(job.shown, f"measure nesting, {job.heads} heads", None)
                nestings[(*key, limit)] = measure(model.subnetwork(job.heads), _ranges(model, job.heads), evalset,
                                                  references[key], limit)
            nesting = nestings[(*key, limit)]
        shared.append(replace(job, reference=references[key], nesting=nesting))
    return shared


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


WORKERS_LOG = "workers.log"  # what the conversion workers' imports print, in the first bundle's logs/


def _worker_init(torch_threads: int, reports: Any, stop: Any, modules: tuple[str, ...], log: str) -> None:
    """Once per worker: signals, torch's threads, and the converters and runtimes its artefacts use
    imported here (seconds each), not per artefact. What they print on import (absl's and oneDNN's
    banners, torchao's missing CUDA kernels, deprecation warnings) goes to ``log``, shared by the workers."""
    signal.signal(signal.SIGINT, _Worker.on_sigint)
    _Worker.reports = reports
    threading.Thread(target=_relay, args=(stop,), daemon=True).start()
    with capture(Path(log), f"hydra-edge {__version__}: worker {os.getpid()} importing {', '.join(modules)}",
                 fresh=False):
        import torch

        torch.set_num_threads(torch_threads)
        for name in modules:
            import_module(name)


def warm_modules(jobs: Sequence[Job]) -> tuple[str, ...]:
    """Exporter, converter and runtime modules the artefacts of ``jobs`` need, each once."""
    formats = dict.fromkeys(job.variant.format for job in jobs)
    return tuple(dict.fromkeys(name for fmt in formats
                               for name in (FORMATS[fmt].exporter, *exporter(fmt).IMPORTS, FORMATS[fmt].module)))


def _run_in_worker(job: Job) -> tuple[ArtefactRecord, int]:
    """The record, and this worker's peak resident memory so far."""
    with _Commit(then=_Worker.stop) as commit:
        _Worker.busy = True
        try:
            if _Worker.stopping:
                raise KeyboardInterrupt
            record = run_job(job, lambda file, stage, size: _Worker.reports.put((file, stage, size)), commit.hold)
            return record, peak_rss_bytes()
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
    from ..model.checkpoint import load_checkpoint_file, weights_entry
    from ..model.config import parse_heads
    from ..train.data import DataSpec, load_data

    if opts.max_drop < 0 or (opts.jobs is not None and opts.jobs < 1) or opts.eval_limit < 1:
        raise HydraEdgeError("--max-drop must be >= 0, --jobs and --eval-limit >= 1")
    if opts.layout not in LAYOUTS:
        raise HydraEdgeError(f"unknown --layout {opts.layout!r}; choose one of {', '.join(LAYOUTS)}")
    target = load_target(opts.target)
    variants = target.variants(opts.quant, opts.optional)
    for v in variants:
        attention_matmuls(v.options, f"{target.source}: {v.key}")
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


def plan(opts: ConvertOptions, inputs: Inputs, shown: str = "") -> Plan:
    """Split the artefacts into jobs to run and records still valid (call with the bundle locked);
    ``shown`` prefixes the names progress reports use (``<target>/`` with several targets)."""
    from ..model.checkpoint import EMA_ENTRIES

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
                skipped.append(shown + file)
                continue
            jobs.append(Job(
                checkpoint=str(opts.checkpoint), checkpoint_sha256=ckpt_sha, heads=k, variant=v, file=file,
                out=str(opts.out), data=data, eval_limit=opts.eval_limit, golden_inputs=target.golden_inputs,
                max_drop=opts.max_drop, threads=target.threads, fingerprint=fp, device_build=build,
                ema=inputs.weights in EMA_ENTRIES, shown=shown + file,
            ))
    return Plan(manifest, jobs, skipped)


def _failure(job: Job, error: BaseException) -> str:
    """One line naming the artefact (``<target>/<file>`` with several targets), what failed, and its log."""
    log = f"; converter output: {artefact_log(Path(job.out), job.file)}"
    target = job.shown[: -len(job.file)]
    if isinstance(error, HydraEdgeError):
        return target + (str(error) if job.file in str(error) else f"{job.file}: {error}") + log
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{job.shown}: conversion failed ({type(error).__name__}: {first})" + log


def targets_options(opts: ConvertOptions, given: Sequence[str]) -> list[ConvertOptions]:
    """One bundle per target: ``opts.out`` itself for one target (as always), ``opts.out/<target name>``
    for several. ``given`` as typed: each item a name, a .toml path or a comma-separated list of them.
    An unknown or repeated target fails here, in one line, before anything is written."""
    targets = [name.strip() for item in given for name in item.split(",")]
    if not all(targets):
        raise HydraEdgeError(f"--target {','.join(given)!r} has an empty name; separate targets with single commas")
    if len(targets) == 1:
        return [replace(opts, target=targets[0])]
    names = [load_target(t).name for t in targets]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise HydraEdgeError(f"target {repeated[0]!r} is given twice in --target; name each target once")
    return [replace(opts, target=t, out=opts.out / name) for t, name in zip(targets, names)]


def convert(opts: ConvertOptions, report: Report | None = None, note: Note | None = None) -> ConvertResult:
    """Convert, verify and record every artefact of ``opts``; never raises for one bad artefact."""
    return convert_targets([opts], report, note)[0]


def convert_targets(runs: Sequence[ConvertOptions], report: Report | None = None,
                    note: Note | None = None) -> list[ConvertResult]:
    """Convert, verify and record every artefact of each of ``runs`` (one bundle each, one target
    each, same checkpoint, data and worker count), sharing references and workers between them.

    Failures are collected (``result.failed``) so that the other artefacts still finish; each
    manifest is rewritten after every artefact, so an interrupted run resumes where it stopped.
    One run at a time per bundle: a second waits for the lock (or, with ``wait=False``, stops
    with the holder's name).
    """
    from ..model.checkpoint import EMA_ENTRIES

    report = report or (lambda file, stage, size: None)
    note = note or (lambda line: None)
    inputs = [check_inputs(opts) for opts in runs]
    if len({opts.out.resolve() for opts in runs}) < len(runs):
        raise HydraEdgeError("two targets would write the same bundle folder; give each its own --out")
    for opts in runs:
        _prepare_out(opts.out)
    prefixes = [f"{i.target.name}/" if len(runs) > 1 else "" for i in inputs]  # names progress shows
    with ExitStack() as locks:
        for opts in sorted(runs, key=lambda o: str(o.out.resolve())):  # one order: two runs cannot deadlock
            locks.enter_context(exclusive(opts.out / LOCK, f"bundle {opts.out}", opts.wait))
        for opts in runs:
            _remove_stale(opts.out)
        plans = [plan(opts, i, shown) for opts, i, shown in zip(runs, inputs, prefixes)]
        try:
            results = _convert(runs, plans, report, note, _model_bytes(inputs[0].config))
        finally:
            # Every worker has stopped. A Ctrl-C that lands between creating an artefact's temp file
            # and entering the block that removes it leaves that file: clear it now, not next run.
            for opts in runs:
                _remove_stale(opts.out)
        for opts, i, result, shown in zip(runs, inputs, results, prefixes):
            apply_layout(opts.out, result.manifest, opts.layout, str(opts.checkpoint),
                         lambda file, stage, size: report(shown + file, stage, size), ema=i.weights in EMA_ENTRIES)
        return results


def _model_bytes(cfg: HydraConfig) -> int:
    from ..model.sizes import subnet_size

    return 4 * subnet_size(cfg, cfg.num_heads).params


def _convert(runs: Sequence[ConvertOptions], plans: Sequence[Plan], report: Report, note: Note,
             model_bytes: int) -> list[ConvertResult]:
    results = {}
    for opts, todo in zip(runs, plans):
        for file in todo.skipped:
            report(file, "skipped (unchanged)", None)
        results[str(opts.out)] = ConvertResult(manifest=todo.manifest, out=opts.out, skipped=todo.skipped)
        todo.manifest.write(opts.out)
    jobs = [job for todo in plans for job in todo.jobs]
    chosen = choose_jobs(runs[0].jobs, len(jobs), model_bytes)
    n = chosen.n if len(jobs) > 1 else 1
    if jobs:
        note(f"converting {len(jobs)} artefacts with {chosen.why}")
    threads = max(1, cores() // n)
    start = time.perf_counter()
    jobs = share_references([replace(job, verify_threads=threads) for job in jobs], report)
    reference_seconds = time.perf_counter() - start
    if jobs:
        note(f"fp32 references and nesting measurements: {reference_seconds:.1f} s")
    peak = 0

    def finish(job: Job, done: tuple[ArtefactRecord, int] | None, error: BaseException | None) -> None:
        nonlocal peak
        result = results[job.out]
        if error is not None:
            result.failed.append(_failure(job, error))
            report(job.shown, "FAILED", None)
            return
        assert done is not None, "a job that did not fail has its record"
        record, peak = done[0], max(peak, done[1])
        result.manifest.put(record)
        result.manifest.write(result.out)
        result.converted.append(job.shown)

    if n == 1:
        for job in jobs:
            with _Commit() as commit:
                try:
                    record = run_job(job, report, commit.hold)
                except Exception as e:  # one artefact's failure must not stop the others
                    finish(job, None, e)
                else:
                    finish(job, (record, peak_rss_bytes()), None)
    else:
        _run_parallel(jobs, n, threads, report, finish)
    for result in results.values():
        result.jobs, result.reference_seconds, result.peak_worker_bytes = n, reference_seconds, peak
    if peak:
        note(f"peak memory per {'worker' if n > 1 else 'process'}: {peak / 2**30:.2f} GiB")
    return list(results.values())


def _run_parallel(jobs: list[Job], n: int, torch_threads: int, report: Report,
                  finish: Callable[[Job, "tuple[ArtefactRecord, int] | None", BaseException | None], None]) -> None:
    """Independent artefacts in ``n`` spawned processes; stage reports come back over a queue.

    On Ctrl-C the workers stop (an artefact being made is dropped, one being renamed into place
    is finished) and every artefact that did finish is recorded before the interrupt goes on.
    """
    ctx = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools mid-use
    reports, stop = ctx.Queue(), ctx.Event()
    log = Path(jobs[0].out) / LOGS / WORKERS_LOG  # beside the references' log
    log.unlink(missing_ok=True)  # this run's workers append to it
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                             initargs=(torch_threads, reports, stop, warm_modules(jobs), str(log))) as pool:
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
