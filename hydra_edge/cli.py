"""The ``hydra-edge`` command line: one click group; each command lives in the module of its stage."""

from __future__ import annotations

import click

from .measure.command import calibrate
from .command import CONTEXT, Group
from .convert.command import convert
from .convert.targets_command import targets
from .demo import demo
from .deploy import deploy
from .eval_command import evaluate
from .expand import expand_command
from .info_command import info
from .lut.command import lut
from .train_command import train


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="hydra-edge")
def main() -> None:
    """hydra-edge: train one HydraViT, take its subnetworks to boards and phones.

    Example: hydra-edge demo
    """


for command in (info, train, evaluate, convert, expand_command, targets, calibrate, lut, deploy, demo):
    main.add_command(command)


if __name__ == "__main__":  # torchrun --nproc_per_node N -m hydra_edge.cli train ...
    main()
