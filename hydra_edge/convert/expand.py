"""A compact bundle as plain per-head-count files, for tools that read only files.

trtexec, benchmark_model and executor_runner take a model file; this writes each artefact as the
file the manifest describes (rebuilt, sha256 checked against the manifest), with its golden pair
and a manifest of the full layout, so ``--out`` is itself a bundle.

A bundle's rules hold for what expand writes: ``--out`` is a new or empty folder (never another
bundle, never a folder with files of someone else's), held under the bundle lock convert takes;
every file written is one the manifest names, read once, its sha256 checked on the bytes read and
never through a link leading out of the bundle. Everything is written to a folder of its own inside
``--out`` first and moved into place only once every file has passed, so a failure leaves nothing.

Killed at any point (kill -9, a power cut), expand leaves nothing a rerun trips on: before the first
file moves into ``--out``, a journal naming every file about to move is renamed into place, and the
manifest moves last. A rerun finds the journal, removes what it names (the manifest too) and the
staging folder, and writes the bundle again; without a journal, ``--out`` holds only its own staging.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, List, Tuple

import msgspec

from ..atomic import read_limited, write_bytes
from ..errors import HydraEdgeError
from ..lock import LockedError, exclusive, holder
from ..records.manifest import LOCK, MANIFEST, Manifest, golden_files, read_manifest
from ..runtime.bundle_files import bundle_bytes
from ..runtime.engines import GOLDEN_MAX_BYTES
from ..runtime.rebuild import artefact_bytes

STAGING = ".expand-"  # prefix of the folder inside --out where files wait until every one has passed
JOURNAL = f"{STAGING}journal.json"  # in --out while files move in: what a rerun removes, should expand die
JOURNAL_MAX_BYTES = 1 << 20
CHOOSE = "choose a new or empty folder for --out"


def _ours(name: str) -> bool:
    """A name expand (or the bundle lock) leaves in --out: the lock, its owner note, a staging folder."""
    return name == LOCK or name.startswith((f"{LOCK}.", STAGING))


def _check_out(bundle: Path, out: Path) -> None:
    """``out`` is outside the bundle and is new, or empty but for what expand itself leaves there."""
    if out.resolve().is_relative_to(bundle.resolve()):
        raise HydraEdgeError(f"--out {out} is inside the bundle {bundle}; {CHOOSE}")
    if not out.exists():
        return
    if not out.is_dir():
        raise HydraEdgeError(f"--out {out} is not a folder; {CHOOSE}")
    if (out / MANIFEST).exists() and not (out / JOURNAL).exists():  # with a journal: a killed expand's
        raise HydraEdgeError(f"--out {out} holds a bundle ({out / MANIFEST}); expand writes a new one: {CHOOSE}")
    left = {PurePosixPath(name).parts[0] for name in _journal(out)}
    foreign = sorted(p.name for p in out.iterdir() if not _ours(p.name) and p.name not in left)
    if foreign:
        raise HydraEdgeError(f"--out {out} holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, "
                             f"which expand did not write; expand writes a new bundle: {CHOOSE}")


def _journal(out: Path) -> List[str]:
    """The files a killed expand was moving into ``out`` (its manifest among them), from its journal; none
    without one. Each name is checked to stay inside ``out``: the journal is a file anyone could edit."""
    try:
        names = msgspec.json.decode(read_limited(out / JOURNAL, JOURNAL_MAX_BYTES), type=List[str])
    except FileNotFoundError:
        return []
    except (OSError, HydraEdgeError, msgspec.DecodeError) as e:
        raise HydraEdgeError(f"{out / JOURNAL}, left by a killed expand, cannot be read ({e}); remove {out} "
                             "and re-run expand") from None
    for name in names:
        path = PurePosixPath(name)
        if path.is_absolute() or not path.parts or ".." in path.parts or _ours(path.parts[0]):
            raise HydraEdgeError(f"{out / JOURNAL} names {name!r}, not a file of a bundle; remove {out} and "
                                 "re-run expand")
    return names


def _clean(out: Path) -> None:
    """Remove what a killed expand left in ``out``: the files its journal names (folders they left empty
    too), then the journal, then staging folders. Killed while cleaning, the next rerun cleans again."""
    names = _journal(out)
    for name in names:
        (out / name).unlink(missing_ok=True)
    for folder in sorted({p for name in names for p in (out / name).parents if p != out and p.is_relative_to(out)},
                         key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # not empty (not only ours) or already gone: left as it is
            pass
    (out / JOURNAL).unlink(missing_ok=True)
    for stale in out.glob(f"{STAGING}*"):  # no one else writes here: the lock is held
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """``out`` created if new and held under the bundle lock convert takes. A held lock (a convert writing
    there) is refused, naming its holder: expand never waits to write into a folder someone else fills."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HydraEdgeError(f"cannot create --out {out}: {e.strerror}; {CHOOSE}") from None
    try:
        with exclusive(out / LOCK, f"--out {out}", wait=False):
            yield
    except LockedError:
        raise HydraEdgeError(f"--out {out} is in use by {holder(out / LOCK)}; {CHOOSE}") from None


def _golden(bundle: Path, manifest: Manifest) -> Iterator[Tuple[str, bytes]]:
    """Every golden file the manifest names, once each: its name and its bytes, sha256 checked on them."""
    wanted: Dict[Tuple[str, str], str] = {}
    for record in manifest.artefacts:
        for name, sha256, field in golden_files(record.golden):
            wanted.setdefault((name, sha256), field)
    for (name, sha256), field in wanted.items():
        yield name, bundle_bytes(bundle, name, sha256, field, GOLDEN_MAX_BYTES)


def _stage(bundle: Path, manifest: Manifest, staging: Path) -> List[str]:
    """Every file of the expanded bundle written under ``staging``, each checked before it is written and
    held in memory alone; returns their names."""
    names = []
    for record in manifest.artefacts:
        write_bytes(staging / _own_name(bundle, record.file), artefact_bytes(bundle, record))
        names.append(record.file)
    for name, data in _golden(bundle, manifest):
        write_bytes(staging / _own_name(bundle, name), data)
        names.append(name)
    return names


def _own_name(bundle: Path, name: str) -> str:
    """``name`` if it is no name expand keeps for itself in --out (the manifest, the lock, staging)."""
    if name == MANIFEST or _ours(PurePosixPath(name).parts[0]):
        raise HydraEdgeError(f"{bundle / MANIFEST} names a file {name!r}, which expand keeps for its own use; "
                             "re-run hydra-edge convert into a new folder")
    return name


def _full(manifest: Manifest) -> Manifest:
    """The manifest of the full layout: every artefact a file of its own, no layout note."""
    return msgspec.structs.replace(manifest, artefacts=[
        msgspec.structs.replace(r, compact=None, notes={k: v for k, v in r.notes.items() if k != "layout"})
        for r in manifest.artefacts])


def expand(bundle: Path, out: Path) -> List[Path]:
    """Write every artefact of ``bundle`` in full to the new folder ``out``; returns the artefact files."""
    manifest = read_manifest(bundle)
    _check_out(bundle, out)
    with _locked(out):
        _clean(out)
        _check_out(bundle, out)
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=out))
        try:
            names = _stage(bundle, manifest, staging)
            _full(manifest).write(staging)
            write_bytes(staging / JOURNAL, msgspec.json.encode([*names, MANIFEST]))
            os.replace(staging / JOURNAL, out / JOURNAL)  # whole or not at all, before anything moves
            for name in names:
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / name, out / name)
            os.replace(staging / MANIFEST, out / MANIFEST)  # last: a bundle only once all its files are there
            (out / JOURNAL).unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return [out / record.file for record in manifest.artefacts]
