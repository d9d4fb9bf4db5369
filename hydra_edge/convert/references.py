"""What every variant and target of a head count shares: its fp32 reference logits and its nesting
measurement, each computed once, batched, with every core, before any artefact is made."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import __version__
from ..logs import LOGS, capture
from ..records.manifest import Nesting
from .artefact import weight_ranges
from .formats import exporter
from .inputs import context
from .nesting import max_cost, measure
from .options import Report
from .plan import Job
from .verify import eager_logits


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
        model, evalset, _ = context(*job.context_key())
        key = (*job.context_key(), job.heads)
        if key not in references:
            report(job.shown, f"fp32 reference, {job.heads} heads", None)
            references[key] = eager_logits(model.subnetwork(job.heads), evalset.images)
        nesting = None
        if job.variant.quant in exporter(job.variant.format).NESTED:
            limit = max_cost(job.variant.options)
            if (*key, limit) not in nestings:
                report(job.shown, f"measure nesting, {job.heads} heads", None)
                nestings[(*key, limit)] = measure(model.subnetwork(job.heads), weight_ranges(model, job.heads),
                                                  evalset, references[key], limit)
            nesting = nestings[(*key, limit)]
        shared.append(replace(job, reference=references[key], nesting=nesting))
    return shared
