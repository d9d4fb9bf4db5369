"""``hydra-edge expand``: a compact bundle as plain per-head-count files, for tools that read only files.

trtexec, benchmark_model and executor_runner take a model file; this writes each artefact as the
file the manifest describes (rebuilt, sha256 checked against the manifest), with its golden pair
and a manifest of the full layout, so ``--out`` is itself a bundle.
"""

from __future__ import annotations

from pathlib import Path

import click
import msgspec

from .atomic import write_bytes
from .command import command
from .errors import HydraEdgeError
from .records.manifest import golden_files, read_manifest
from .runtime.rebuild import artefact_bytes


def expand(bundle: Path, out: Path) -> list[Path]:
    """Write every artefact of ``bundle`` in full to ``out``; returns the files written."""
    manifest = read_manifest(bundle)
    if out.resolve() == bundle.resolve():
        raise HydraEdgeError(f"--out {out} is the bundle itself; choose another folder")
    written = []
    for record in manifest.artefacts:
        write_bytes(out / record.file, artefact_bytes(bundle, record))  # checked before it is written
        written.append(out / record.file)
        for name, _, _ in golden_files(record.golden):
            if not (out / name).exists():
                write_bytes(out / name, (bundle / name).read_bytes())
    manifest.artefacts = [msgspec.structs.replace(r, compact=None, notes={k: v for k, v in r.notes.items() if k != "layout"})
                          for r in manifest.artefacts]
    manifest.write(out)
    return written


@command("expand")
@click.option("--bundle", "-b", required=True, type=click.Path(path_type=Path), help="Bundle folder (manifest.json).")
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path), help="Folder for the full files.")
def expand_command(bundle: Path, out: Path) -> None:
    """Write each head count's artefact as a plain file whose sha256 is the manifest's.

    \b
    Example:
      hydra-edge expand --bundle bundles/jetson --out bundles/jetson-files
    """
    for path in expand(bundle, out):
        click.echo(path)
