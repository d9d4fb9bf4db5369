"""The calibration record, for the calibrator and the lookup table: the schema is
``hydra_edge.records.calibration`` (torch-free: boards may read it too); this host-side reader
also folds in the journal a calibrator killed mid-run left beside it, so nothing it reported is lost."""

from __future__ import annotations

from pathlib import Path

from ..records import calibration as _record
from ..records.calibration import SCHEMA, SCHEMA_VERSION, Calibration, Derating, HeadResult
from .journal import replay

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Calibration", "Derating", "HeadResult", "read_calibration"]


def read_calibration(path: str | Path) -> Calibration:
    """The record at ``path`` with every result its journal holds beyond it."""
    return replay(_record.read_calibration(path), Path(path))
