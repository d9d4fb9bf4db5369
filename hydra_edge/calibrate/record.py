"""The calibration record, for the calibrator and the lookup table: the schema is
``hydra_edge.records.calibration`` (torch-free: boards may read it too)."""

from ..records.calibration import SCHEMA, SCHEMA_VERSION, Calibration, Derating, HeadResult, read_calibration

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Calibration", "Derating", "HeadResult", "read_calibration"]
