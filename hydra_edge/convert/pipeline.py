"""The conversion pipeline: check the inputs, plan one job per (head count, target variant), skip what
is unchanged, run the rest (in worker processes with ``jobs > 1``), verify each, rewrite the manifest
after each.

Several targets convert in one run, one bundle each, sharing what does not depend on the target:
each head count's fp32 reference logits and nesting measurement are computed once, batched, with
every core, before any artefact, and the same warm workers make every target's artefacts.

Each stage has its own module: ``options`` (what was asked), ``inputs`` (checked before anything is
written), ``naming`` (file names, fingerprints), ``plan`` (jobs), ``references`` (what head counts
share), ``artefact`` (one artefact), ``pool`` (worker processes, Ctrl-C); this one orders them.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..errors import HydraEdgeError
from ..lock import exclusive, remove_unused
from ..model.config import HydraConfig
from ..records.manifest import LOCK, ArtefactRecord
from .artefact import failure, run_job
from .inputs import check_inputs, prepare_out
from .layout import apply_layout
from .options import ConvertOptions, ConvertResult, Note, Report
from .plan import Job, Plan, plan, remove_unlisted
from .pool import Commit, remove_stale, run_parallel
from .references import share_references
from .targets import load_target
from .workers import choose_jobs, cores, peak_rss_bytes


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
    if inputs[0].warning:  # the same checkpoint for every target: said once, before anything is converted
        note(inputs[0].warning)
    if len({opts.out.resolve() for opts in runs}) < len(runs):
        raise HydraEdgeError("two targets would write the same bundle folder; give each its own --out")
    created = {opts.out: _created_by(opts.out) for opts in runs}
    try:
        for opts in runs:
            prepare_out(opts.out)
    except HydraEdgeError:
        _discard_unused(created)
        raise
    prefixes = [f"{i.target.name}/" if len(runs) > 1 else "" for i in inputs]  # names progress shows
    with ExitStack() as locks:
        # Pushed first, so it runs last, once the locks (and their owner notes) are released: see _discard_unused.
        # Returns None, so the exception goes on.
        locks.push(lambda kind, error, trace: _discard_unused(created) if kind else None)
        for opts in sorted(runs, key=lambda o: str(o.out.resolve())):  # one order: two runs cannot deadlock
            locks.enter_context(exclusive(opts.out / LOCK, f"bundle {opts.out}", opts.wait))
        for opts in runs:
            remove_stale(opts.out)
        plans = [plan(opts, i, shown) for opts, i, shown in zip(runs, inputs, prefixes)]
        try:
            results = _convert(runs, plans, report, note, _model_bytes(inputs[0].config))
        finally:
            # Every worker has stopped. A Ctrl-C that lands between creating an artefact's temp file
            # and entering the block that removes it leaves that file: clear it now, not next run.
            for opts in runs:
                remove_stale(opts.out)
        for opts, todo, result in zip(runs, plans, results):
            remove_unlisted(opts.out, result.manifest, todo.unlisted)
        for opts, i, result, shown in zip(runs, inputs, results, prefixes):
            apply_layout(opts.out, result.manifest, opts.layout, str(opts.checkpoint),
                         lambda file, stage, size: report(shown + file, stage, size), ema=i.weights in EMA_ENTRIES)
        return results


def _created_by(out: Path) -> Path | None:
    """The top folder that creating ``out`` would create (``out`` or an ancestor), or None if it exists."""
    top = None
    for folder in (out, *out.parents):
        if folder.exists() or folder.is_symlink():
            return top
        top = folder
    return top


def _discard_unused(created: dict[Path, Path | None]) -> None:
    """Remove the bundle folders this run created that hold nothing but their lock, and the folders above
    them it created, once empty: a run that stopped at its start (a refusal, Ctrl-C, a full disk before the
    first manifest) leaves no empty folder holding ``.lock`` that looks like a bundle and that the next run,
    or a user choosing another ``--out``, trips over. Anything else in a folder keeps it, and so does a lock
    another run holds (``remove_unused``); a run that waits for it makes the folder again as it takes it."""
    for out, top in created.items():
        if top is None or not out.is_dir() or any(entry.name != LOCK for entry in out.iterdir()):
            continue
        if not remove_unused(out / LOCK):
            continue
        for folder in (out, *out.parents):
            try:
                folder.rmdir()
            except OSError:  # not empty: another target's bundle, or what someone else put there
                break
            if folder == top:
                break


def _model_bytes(cfg: HydraConfig) -> int:
    """The largest subnetwork's fp32 weight bytes: what a worker's memory estimate scales with."""
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
        note(f"converting {len(jobs)} artefact{'s' if len(jobs) > 1 else ''} with {chosen.why}")
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
            result.failed.append(failure(job, error))
            report(job.shown, "FAILED", None)
            return
        assert done is not None, "a job that did not fail has its record"
        record, peak = done[0], max(peak, done[1])
        result.manifest.put(record)
        result.manifest.write(result.out)
        result.converted.append(job.shown)

    if n == 1:
        for job in jobs:
            with Commit() as commit:
                try:
                    record = run_job(job, report, commit.hold)
                except Exception as e:  # one artefact's failure must not stop the others
                    finish(job, None, e)
                else:
                    finish(job, (record, peak_rss_bytes()), None)
    else:
        run_parallel(jobs, n, threads, report, finish)
    for result in results.values():
        result.jobs, result.reference_seconds, result.peak_worker_bytes = n, reference_seconds, peak
    if peak:
        note(f"peak memory per {'worker' if n > 1 else 'process'}: {peak / 2**30:.2f} GiB")
    return list(results.values())
