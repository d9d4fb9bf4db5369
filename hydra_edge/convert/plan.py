"""Planning: one ``Job`` per (head count, target variant), or the record kept when its fingerprint
and bytes are unchanged, so that an interrupted or repeated run makes only what is missing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .. import __version__
from ..atomic import sha256_file
from ..errors import HydraEdgeError
from ..records.manifest import (MANIFEST, ArtefactRecord, Manifest, Nesting, golden_files, intact, read_manifest,
                                stored_files)
from .inputs import Inputs
from .naming import artefact_name, fingerprint, tool_versions
from .options import ConvertOptions
from .targets import Variant
from .verify import within_drop


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

    def context_key(self) -> tuple[str, str, str, int, bool]:
        """What ``inputs.context`` loads for this job: equal for every job of one checkpoint, data and eval set."""
        return self.checkpoint, self.checkpoint_sha256, json.dumps(self.data), self.eval_limit, self.ema


@dataclass
class Plan:
    manifest: Manifest  # to update: old records kept when checkpoint and target are unchanged
    jobs: list[Job]  # artefacts to make
    skipped: list[str]  # files whose fingerprint and bytes are unchanged
    # Records the run's --max-drop fails (a stricter bound than they were made under): made again, and unlisted
    # meanwhile, so a manifest never lists an artefact its own max_drop refuses, even if the new one fails too.
    unlisted: list[ArtefactRecord] = field(default_factory=list)


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
    jobs, skipped, unlisted = [], [], []
    for k in inputs.heads:
        for v in inputs.variants:
            file = artefact_name(k, v)
            fp = fingerprint(ckpt_sha, k, v, data, opts.eval_limit, target.golden_inputs, inputs.weights)
            build = v.device_build.format(file=file, engine=f"{Path(file).stem}.engine") if v.device_build else None
            rec = previous.get(f"h{k}_{v.key}")
            within = within_drop(rec.accuracy, opts.max_drop) if rec else False  # a stricter --max-drop re-checks
            if rec and within and not opts.force and rec.fingerprint == fp and intact(opts.out, rec):
                # Unchanged bytes; refresh what the profile says about running them.
                manifest.put(msgspec.structs.replace(rec, runtime=v.runtime, runtime_min_version=v.runtime_min_version,
                                                     threads=target.threads, device_build=build))
                skipped.append(shown + file)
                continue
            if rec and not within:
                unlisted.append(rec)
                manifest.artefacts = [a for a in manifest.artefacts if a.id != rec.id]
            jobs.append(Job(
                checkpoint=str(opts.checkpoint), checkpoint_sha256=ckpt_sha, heads=k, variant=v, file=file,
                out=str(opts.out), data=data, eval_limit=opts.eval_limit, golden_inputs=target.golden_inputs,
                max_drop=opts.max_drop, threads=target.threads, fingerprint=fp, device_build=build,
                ema=inputs.weights in EMA_ENTRIES, shown=shown + file,
            ))
    return Plan(manifest, jobs, skipped, unlisted)


def remove_unlisted(out: Path, manifest: Manifest, records: list[ArtefactRecord]) -> None:
    """Delete the files of ``records`` that ``manifest`` no longer lists (made again and failed), unless a
    listed record keeps them (a compact artefact's source): the bundle then holds what its manifest names.
    Call with the bundle locked."""
    listed = {a.id for a in manifest.artefacts}
    gone = [r for r in records if r.id not in listed]
    if not gone:
        return
    kept = {name for r in manifest.artefacts for name in _file_names(out, r)}
    for name in {name for r in gone for name in _file_names(out, r)} - kept:
        (out / name).unlink(missing_ok=True)


def _file_names(out: Path, record: ArtefactRecord) -> set[str]:
    """The bundle's names of ``record``'s artefact files and golden pair (a damaged recipe: itself only)."""
    try:
        stored = {name for name, _, _ in stored_files(out, record)}
    except HydraEdgeError:
        stored = {record.compact.recipe} if record.compact is not None else {record.file}
    return stored | {name for name, _, _ in golden_files(record.golden)}
