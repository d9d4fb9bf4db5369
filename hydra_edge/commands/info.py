"""``hydra-edge info``: width, parameters, GMACs and fp32/int8 size of every subnetwork."""

from __future__ import annotations

from pathlib import Path

import click

from .base import command, ema_option, print_table


@command()
@click.option("--preset", "preset_name", default=None, help="A preset: b16 or digits.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Or a checkpoint.")
@ema_option
def info(preset_name: str | None, checkpoint: Path | None, ema: bool) -> None:
    """Width, parameters, GMACs and fp32/int8 size of every subnetwork.

    Example: hydra-edge info --preset b16
    """
    from ..model.config import preset
    from ..model.sizes import size_table

    if checkpoint:
        from ..model.checkpoint import load_checkpoint

        cfg, title = load_checkpoint(checkpoint, ema=ema).config, str(checkpoint)
    else:
        cfg, title = preset(preset_name or "b16"), f"preset {preset_name or 'b16'}"
    rows = [
        [str(s.heads), str(s.width), f"{s.params / 1e6:.2f}", f"{s.gmacs:.3f}", f"{s.fp32_mib:.1f}", f"{s.int8_mib:.1f}"]
        for s in size_table(cfg)
    ]
    print_table(title, ["heads", "width", "params (M)", "GMACs", "fp32 MiB", "int8 MiB"], rows)
