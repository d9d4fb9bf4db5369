"""What a conversion run is asked for (``ConvertOptions``) and what it hands back (``ConvertResult``),
kept apart from the work so that the command, the benches and the pipeline's stages share one
definition without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..records.manifest import Manifest

Report = Callable[[str, str, "int | None"], None]  # (artefact file, stage, bytes when done)
Note = Callable[[str], None]  # one line about the whole run (workers chosen, references computed)


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
