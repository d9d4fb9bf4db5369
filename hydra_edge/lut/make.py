"""Every file ``hydra-edge lut`` writes: lut.json, the C header, the Kotlin object, lut.md and lut.png.

All are rendered before any is written, so a failure leaves the old outputs as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..atomic import check_outputs, write_bytes, write_text
from ..measure.journal import read_calibration
from ..records import lut as record
from ..records.manifest import read_manifest
from .emit_c import emit_c
from .emit_kotlin import emit_kotlin
from .plot import markdown, plot_grid
from .policy import load_policy, policy_from_dict
from .table import build_table

OUTPUTS = ("lut.json", "hydra_lut.h", "HydraLut.kt", "lut.md", "lut.png")


def make_lut(bundle: Path, calibration: Path, out: Path, budget_ms: float | None = None,
             policy: Path | None = None, say: Callable[[str], None] = lambda line: None) -> dict:
    """Build the table and write every output into ``out``; returns the ``lut.json`` document. ``say`` gets
    build_table's lines on what the table leaves out."""
    check_outputs(*(out / name for name in OUTPUTS))
    pol = load_policy(policy)
    if budget_ms is not None:
        pol = policy_from_dict({**pol.to_dict(), "budget_ms": budget_ms}, "--budget-ms")
    lut = build_table(bundle, read_manifest(bundle), read_calibration(calibration), calibration, pol, say)
    # Everything rendered before anything is written: a failure leaves the old outputs as they were.
    document = record.encode(lut, str(out / "lut.json"))
    header, kotlin, table, png = emit_c(lut), emit_kotlin(lut), markdown(lut), plot_grid(lut)
    write_bytes(out / "lut.json", document)
    write_text(out / "hydra_lut.h", header)
    write_text(out / "HydraLut.kt", kotlin)
    write_text(out / "lut.md", table)
    write_bytes(out / "lut.png", png)
    return lut
