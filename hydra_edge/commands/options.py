"""``--ema/--no-ema``: which weights every command that reads a checkpoint loads.

Kept apart from ``checkpoint`` so that declaring the option imports no torch (``-h`` stays quick).
"""

from __future__ import annotations

import click

ema_option = click.option(
    "--ema/--no-ema", default=True, show_default=True,
    help="Load the checkpoint's EMA weights (state_dict_ema, model_ema) when it has them: what the official "
         "release is evaluated with. --no-ema loads its plain weights (state_dict, model).",
)
