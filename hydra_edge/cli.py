"""The ``hydra-edge`` command line: one click group; each command is a module of ``commands/``, named as typed."""

from __future__ import annotations

import click

from .commands.android_app import android_app
from .commands.base import CONTEXT, Group
from .commands.calibrate import calibrate
from .commands.convert import convert
from .commands.demo import demo
from .commands.deploy import deploy
from .commands.eval import evaluate
from .commands.expand import expand_command
from .commands.info import info
from .commands.lut import lut
from .commands.targets import targets
from .commands.train import train


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="hydra-edge")
def main() -> None:
    """hydra-edge: train one HydraViT, take its subnetworks to boards and phones.

    Example: hydra-edge demo
    """


for command in (info, train, evaluate, convert, expand_command, targets, calibrate, lut, deploy, android_app, demo):
    main.add_command(command)


if __name__ == "__main__":  # torchrun --nproc_per_node N -m hydra_edge.cli train ...
    main()
