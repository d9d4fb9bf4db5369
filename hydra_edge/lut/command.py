"""``hydra-edge lut``: calibration + bundle + policy -> lut.json, hydra_lut.h, HydraLut.kt, lut.md, lut.png."""

from __future__ import annotations

from pathlib import Path

import click

from ..atomic import check_outputs, write_bytes, write_text
from ..measure.record import read_calibration
from ..command import Number, command
from ..convert.manifest import read_manifest
from ..records import lut as record
from .emit_c import emit_c
from .emit_kotlin import emit_kotlin
from .plot import markdown, plot_grid
from .policy import load_policy, policy_from_dict
from .table import build_table

OUTPUTS = ("lut.json", "hydra_lut.h", "HydraLut.kt", "lut.md", "lut.png")


def make_lut(bundle: Path, calibration: Path, out: Path, budget_ms: float | None = None,
             policy: Path | None = None) -> dict:
    """Build the table and write every output into ``out``; returns the ``lut.json`` document."""
    check_outputs(*(out / name for name in OUTPUTS))
    pol = load_policy(policy)
    if budget_ms is not None:
        pol = policy_from_dict({**pol.to_dict(), "budget_ms": budget_ms}, "--budget-ms")
    lut = build_table(bundle, read_manifest(bundle), read_calibration(calibration), calibration, pol)
    # Everything rendered before anything is written: a failure leaves the old outputs as they were.
    document = record.encode(lut, str(out / "lut.json"))
    header, kotlin, table, png = emit_c(lut), emit_kotlin(lut), markdown(lut), plot_grid(lut)
    write_bytes(out / "lut.json", document)
    write_text(out / "hydra_lut.h", header)
    write_text(out / "HydraLut.kt", kotlin)
    write_text(out / "lut.md", table)
    write_bytes(out / "lut.png", png)
    return lut


@command()
@click.option("--bundle", "-b", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Bundle folder written by hydra-edge convert.")
@click.option("--calibration", "-c", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Calibration JSON measured on the device for this bundle.")
@click.option("--budget-ms", type=Number(0, 1e12, min_open=True), default=None,
              help="Latency budget on mains power, > 0 (overrides the policy's).")
@click.option("--policy", "-p", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Policy TOML: battery bands, thermal bands, margins, dwell (default: built-in).")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path("lut"), show_default=True,
              help="Folder for lut.json, hydra_lut.h, HydraLut.kt, lut.md and lut.png.")
def lut(bundle: Path, calibration: Path, budget_ms: float | None, policy: Path | None, out: Path) -> None:
    """Build the battery/thermal lookup table that picks a head count on the device.

    Each (battery band, thermal band) gets the most accurate Pareto-optimal head count whose
    calibrated latency x thermal derating meets the band's budget, else the fastest one.

    \b
    Example:
      hydra-edge lut --bundle bundles/rpi --calibration calibration/pi4.json --budget-ms 80 --out lut/
    """
    doc = make_lut(bundle, calibration, out, budget_ms, policy)
    click.echo(markdown(doc), nl=False)
    click.echo(f"wrote {', '.join(str(out / name) for name in OUTPUTS)}")
