"""``hydra-edge lut``: calibration + bundle + policy -> lut.json, hydra_lut.h, HydraLut.kt, lut.md, lut.png."""

from __future__ import annotations

from pathlib import Path

import click

from ..lut.make import OUTPUTS, make_lut
from ..lut.plot import markdown
from .base import Number, command


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
    doc = make_lut(bundle, calibration, out, budget_ms, policy, say=click.echo)
    click.echo(markdown(doc), nl=False)
    click.echo(f"wrote {', '.join(str(out / name) for name in OUTPUTS)}")
