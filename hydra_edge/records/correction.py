"""The latency correction record (``lut.correction.json`` beside ``lut.json``, schema
``hydra-edge/latency-correction`` v1), as the switcher's latency loop writes it.

The loop learns, in service, how much slower each head count runs than the table was calibrated
for (another process on the same cores, a new governor or OS). It saves what it learned so a
restarted app does not first miss its budget for a sustained window to learn it again. The record
names the bundle (its manifest's sha256) and the table (lut.json's sha256) it was learned against:
learned against another table, its numbers mean nothing. ``saved_at`` is wall-clock time (seconds
since the epoch), so an old file expires across a reboot; one dated in the future is refused by its
reader (``hydra_edge.runtime.correction``), as is anything this schema refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, List, Union

import msgspec
from msgspec import Meta

from ..errors import HydraEdgeError
from . import codec
from .fields import MAX_HEADS, Heads, NonNegFloat, Positive, PosFloat, Sha256

SCHEMA = "hydra-edge/latency-correction"
SCHEMA_VERSION = 1
HINT = "the switcher ignores it (running the table's head counts) and learns again; delete it to silence this"


class CorrectionError(HydraEdgeError):
    """A latency correction that cannot be used: damaged, of another schema, or from another table."""


class LearnedLatency(msgspec.Struct, forbid_unknown_fields=True):
    """What one head count was observed to take, when the loop last judged it."""

    heads: Heads
    p90_ms: NonNegFloat  # the windowed p90 it was judged on
    slowdown: NonNegFloat  # p90_ms / the table's calibrated latency for these heads
    samples: Positive  # how many timings the p90 is of


class CorrectionDocument(msgspec.Struct, forbid_unknown_fields=True):
    created_by: str
    saved_at: NonNegFloat  # wall clock, seconds since the epoch
    manifest_sha256: Sha256  # the bundle it was learned on
    lut_sha256: Sha256  # the table it was learned against
    budget_ms: PosFloat  # the budget in force when it was saved (for a person reading it)
    learned: Annotated[List[LearnedLatency], Meta(max_length=MAX_HEADS)]
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        heads = [entry.heads for entry in self.learned]
        if len(set(heads)) != len(heads):
            raise ValueError("`.learned`: two entries for the same head count")


def decode(data: Union[bytes, str], where: str) -> CorrectionDocument:
    return codec.decode(data, CorrectionDocument, where, "latency correction", HINT, (SCHEMA, SCHEMA_VERSION),
                        CorrectionError)


def read(path: Union[str, Path]) -> CorrectionDocument:
    return codec.read(path, CorrectionDocument, "latency correction", HINT, (SCHEMA, SCHEMA_VERSION),
                      CorrectionError)


def encode(document: Any, where: str) -> bytes:
    """The record's bytes, checked as its reader checks them."""
    return codec.encode(document, CorrectionDocument, where, HINT)
