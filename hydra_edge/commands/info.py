"""``hydra-edge info``: input, classes, and width, parameters, GMACs and fp32/int8 size of every subnetwork."""

from __future__ import annotations

from pathlib import Path

import click

from .base import command, ema_option, print_table

NAMES_SHOWN = 20  # class names listed before "..."; the count is always given


@command()
@click.option("--preset", "preset_name", default=None, help="A preset: b16, mini or digits.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Or a checkpoint.")
@ema_option
def info(preset_name: str | None, checkpoint: Path | None, ema: bool) -> None:
    """Input size, channels and classes; width, parameters, GMACs and fp32/int8 size of every subnetwork.

    Example: hydra-edge info --preset b16
    """
    from ..model.config import preset
    from ..model.sizes import size_table
    from ..train.transfer import describe_input, describe_model

    if checkpoint:
        from ..model.checkpoint import checkpoint_classes, load_checkpoint_file

        model, saved = load_checkpoint_file(checkpoint, ema=ema)
        cfg, title = model.config, str(checkpoint)
        summary = describe_model(cfg, checkpoint_classes(saved, checkpoint, cfg.num_classes), NAMES_SHOWN)
    else:
        cfg, title = preset(preset_name or "b16"), f"preset {preset_name or 'b16'}"
        summary = f"{describe_input(cfg)}; the classifier is sized to the data it is trained on"
    rows = [
        [str(s.heads), str(s.width), f"{s.params / 1e6:.2f}", f"{s.gmacs:.3f}", f"{s.fp32_mib:.1f}", f"{s.int8_mib:.1f}"]
        for s in size_table(cfg)
    ]
    click.echo(summary)
    print_table(title, ["heads", "width", "params (M)", "GMACs", "fp32 MiB", "int8 MiB"], rows)
