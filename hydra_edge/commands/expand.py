"""``hydra-edge expand``: a compact bundle's artefacts as plain files, in a new folder."""

from __future__ import annotations

from pathlib import Path

import click

from ..convert.expand import expand
from .base import command


@command("expand", kept=lambda params: f"nothing: {params['out']} gets its files only once every one has passed")
@click.option("--bundle", "-b", required=True, type=click.Path(path_type=Path), help="Bundle folder (manifest.json).")
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path),
              help="A new or empty folder for the full files.")
def expand_command(bundle: Path, out: Path) -> None:
    """Write each head count's artefact as a plain file whose sha256 is the manifest's, into a new folder.

    \b
    Example:
      hydra-edge expand --bundle bundles/jetson --out bundles/jetson-files
    """
    for path in expand(bundle, out):
        click.echo(path)
