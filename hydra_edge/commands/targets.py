"""``hydra-edge targets``: the target profiles ``--target`` can name, and where each comes from."""

from __future__ import annotations

import click

from ..convert.targets import found, load_target, locate, user_folder
from ..errors import HydraEdgeError
from .base import command


@command("targets")
@click.argument("profiles", nargs=-1)
def targets(profiles: tuple[str, ...]) -> None:
    """List the target profiles: shipped with hydra-edge, in your user folder, or the files named here.

    Each is read and checked as convert reads it; one with a problem is listed, its problem is the
    last line, and the command exits 1. A profile in the user folder hides a shipped one of its name.

    \b
    Example:
      hydra-edge targets
      hydra-edge targets boards/pi-ups.toml
    """
    rows, problems = [], []
    for entry in [locate(p) for p in profiles] if profiles else found():
        try:
            artefacts = ", ".join(v.key for v in load_target(str(entry.path)).artefacts)
        except HydraEdgeError as e:
            artefacts = "cannot be read (below)"
            problems.append(str(e))
        rows.append((entry.name, entry.origin, artefacts, str(entry.path)))
    widths = [max(len(row[i]) for row in [("target", "from", "artefacts", "file"), *rows]) for i in range(3)]
    for row in [("target", "from", "artefacts", "file"), *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    click.echo(f"user folder: {user_folder()} (set HYDRA_EDGE_TARGETS to use another)")
    if problems:
        more = f" (and {len(problems) - 1} more profiles with problems)" if len(problems) > 1 else ""
        raise HydraEdgeError(problems[0] + more)
