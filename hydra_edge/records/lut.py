"""The lookup-table record (``lut.json``, schema ``hydra-edge/lut`` v1), as ``hydra-edge lut`` writes it.

Devices read it (``hydra_edge.runtime.lut``), so besides each field's type and range the shape is
checked here once: bands in order, one cell per (battery band, thermal band), every cell naming a
candidate, candidates fastest first with fewer heads the faster, and no cell running more heads
than a cooler or fuller-battery neighbour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

import msgspec
from msgspec import Meta

from ..errors import HydraEdgeError
from . import codec
from .fields import (Finite, Format, Heads, Name, NonNegative, NonNegFloat, Percent, PosFloat, Sha256, Threads,
                     relative_path)
from .manifest import ClassNames, class_names_problem
from .policy import Policy, Seconds

SCHEMA = "hydra-edge/lut"
SCHEMA_VERSION = 1
HINT = "re-run hydra-edge lut"


class LutError(HydraEdgeError):
    """``lut.json`` cannot be used with this bundle: missing, damaged, foreign or mismatched."""


class BundleRef(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    manifest_sha256: Sha256
    target: Optional[str] = None


class CalibrationRef(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    sha256: Sha256
    device_id: str
    soak: bool


class LutCandidate(msgspec.Struct, forbid_unknown_fields=True):
    heads: Heads
    artefact: Name
    file: str  # relative to the bundle
    sha256: Sha256
    format: Format
    threads: Threads
    latency_ms: NonNegFloat  # calibrated, cool and unthrottled
    accuracy: NonNegFloat  # top-1 %, or the head count (accuracy_basis "heads")
    power_w: Optional[NonNegFloat] = None

    def __post_init__(self) -> None:
        relative_path(self.file, ".file")


class Dominated(msgspec.Struct, forbid_unknown_fields=True):
    heads: Heads
    latency_ms: NonNegFloat
    accuracy: NonNegFloat


class ThermalAxis(msgspec.Struct, forbid_unknown_fields=True):
    source: Literal["temperature", "android"]
    names: List[str]
    edges: Annotated[List[Finite], Meta(max_length=64)]  # ascending
    margin: Annotated[float, Meta(ge=0.0, le=1000.0)]
    throttled_c: Optional[Finite]
    derating: List[PosFloat]
    derating_basis: List[Literal["soak", "default"]]
    # The target's signals name Android's thermal headroom (``cmd thermalservice headroom``): a forecast at
    # or past 1.0 counts as SEVERE, one that cannot be read as a failed thermal signal. Absent (tables
    # written before it was recorded) is false.
    headroom: bool = False

    def __post_init__(self) -> None:
        if list(self.edges) != sorted(set(self.edges)):
            raise ValueError("`.edges`: thermal band edges must rise strictly")
        if self.headroom and self.source != "android":
            raise ValueError("`.headroom`: thermal headroom is an Android forecast; it needs source \"android\"")


class BatteryAxis(msgspec.Struct, forbid_unknown_fields=True):
    names: List[str]
    min_pct: Annotated[List[Percent], Meta(max_length=100)]  # descending, one per discharging band
    margin_pct: Percent
    budget_scale: List[PosFloat]
    max_energy_mj: List[Optional[PosFloat]]

    def __post_init__(self) -> None:
        if list(self.min_pct) != sorted(set(self.min_pct), reverse=True):
            raise ValueError("`.min_pct`: battery band edges must fall strictly")


class Selection(msgspec.Struct, forbid_unknown_fields=True):
    cells: List[List[NonNegative]]  # [battery band][thermal band] -> index into candidates
    min_dwell_s: Seconds
    expected_ms: List[List[NonNegFloat]]
    meets_budget: List[List[bool]]


class LutDocument(msgspec.Struct, forbid_unknown_fields=True):
    created_by: str
    bundle: BundleRef
    calibration: CalibrationRef
    budget_ms: PosFloat
    policy: Policy
    accuracy_basis: Literal["top1", "heads"]
    candidates: Annotated[List[LutCandidate], Meta(min_length=1)]  # fastest first
    dominated: List[Dominated]
    thermal: ThermalAxis
    battery: BatteryAxis
    selection: Selection
    classes: Optional[ClassNames] = None  # the bundle's class names in logit order, None if unknown
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        heads = [c.heads for c in self.candidates]
        if len(set(heads)) != len(heads):
            raise ValueError("`.candidates`: two candidates have the same head count")
        latencies = [c.latency_ms for c in self.candidates]
        if latencies != sorted(latencies):
            raise ValueError("`.candidates`: candidates must be ordered fastest first")
        for i, (faster, slower) in enumerate(zip(heads, heads[1:])):
            if faster > slower:  # the switcher ranks candidates by speed and counts on rank meaning heads
                raise ValueError(f"`.candidates[{i}].heads`: {faster} heads, more than the slower candidates[{i + 1}] "
                                 f"({slower} heads); a faster candidate must run fewer heads")
        rows, columns = len(self.battery.min_pct) + 1, len(self.thermal.edges) + 1
        if len(self.battery.budget_scale) != rows:
            raise ValueError(f"`.battery.budget_scale`: {len(self.battery.budget_scale)} scales for {rows} "
                             "battery bands")
        if len(self.selection.cells) != rows or any(len(r) != columns for r in self.selection.cells):
            raise ValueError(f"`.selection.cells`: needs {rows} rows (battery bands) of {columns} "
                             "cells (thermal bands)")
        for b, row in enumerate(self.selection.cells):
            for t, i in enumerate(row):
                if i >= len(self.candidates):
                    raise ValueError(f"`.selection.cells[{b}][{t}]`: {i} names no candidate "
                                     f"(there are {len(self.candidates)})")
        _never_more_heads(self.selection.cells, heads)
        problem = None if self.classes is None else class_names_problem(self.classes)
        if problem:
            raise ValueError(f"`.classes`: {problem}")


def _never_more_heads(cells: List[List[int]], heads: List[int]) -> None:
    """Refuse a cell that runs more heads than the cell one thermal band cooler or one battery band
    fuller: a device that heats up or drains must never be given more heads (the switcher trusts
    the table for that, and a hand-edited or foreign table is not built by ``hydra-edge lut``)."""
    for b, row in enumerate(cells):
        for t, i in enumerate(row):
            for (nb, nt), says in (((b, t - 1), "a hotter band"), ((b - 1, t), "a lower battery band")):
                if nb >= 0 and nt >= 0 and heads[i] > heads[cells[nb][nt]]:
                    raise ValueError(f"`.selection.cells[{b}][{t}]`: {heads[i]} heads in {says} than "
                                     f"cells[{nb}][{nt}] ({heads[cells[nb][nt]]} heads); head counts must not "
                                     "rise with temperature or fall with battery")


def decode(data: Union[bytes, str], where: str) -> LutDocument:
    return codec.decode(data, LutDocument, where, "lookup table", HINT, (SCHEMA, SCHEMA_VERSION), LutError)


def read(path: Union[str, Path]) -> LutDocument:
    return codec.read(path, LutDocument, "lookup table", HINT, (SCHEMA, SCHEMA_VERSION), LutError)


def encode(document: Dict[str, Any], where: str) -> bytes:
    """``lut.json``'s bytes for a document ``hydra_edge.lut.table.build_table`` made, checked as devices check it."""
    return codec.encode(document, LutDocument, where, HINT)
