"""``hydra-edge expand``: a compact bundle's files written out whole, under the rules of a bundle.

Its ``--out`` is a new or empty folder, locked while expand writes it; every file it writes is one
the manifest names, read once with its sha256 checked, never through a link leading out of the
bundle; and nothing is written there until every file has been checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import numpy as np
import pytest
from click.testing import CliRunner
from filelock import FileLock, Timeout
from support.bounded import without_blocking

from hydra_edge.cli import main
from hydra_edge.convert import expand as expand_module
from hydra_edge.convert.expand import CHOOSE
from hydra_edge.records.manifest import LOCK, MANIFEST, read_manifest
from hydra_edge.records.recipe import read_recipe
from hydra_edge.runtime.engines import load_golden

pytestmark = pytest.mark.slow  # converts a compact bundle to expand


def files_of(folder: Path) -> Dict[str, str]:
    """``{name: sha256}`` of every file below ``folder`` (links as what they point to)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def expand(bundle: Path, out: Path) -> tuple[int, str]:
    """``hydra-edge expand``'s exit code and output."""
    result = CliRunner().invoke(main, ["expand", "--bundle", str(bundle), "--out", str(out)])
    return result.exit_code, result.output


def refused(bundle: Path, out: Path) -> str:
    """``expand`` fails with one line (returned, without click's ``Error: ``) and no traceback."""
    code, output = expand(bundle, out)
    assert code == 1 and "Traceback" not in output, output
    (line,) = output.strip().splitlines()
    assert line.startswith("Error: "), line
    return line[len("Error: "):]


@pytest.fixture
def compact(root: Path, tmp_path: Path) -> Path:
    """A copy of the compact bundle, to change."""
    shutil.copytree(root / "compact", tmp_path / "compact")
    return tmp_path / "compact"


@pytest.fixture
def other(root: Path, tmp_path: Path) -> Path:
    """Another bundle (the full layout of the same model), which no expand may touch."""
    shutil.copytree(root / "full", tmp_path / "other")
    return tmp_path / "other"


@pytest.fixture
def held(other: Path) -> Iterator[Path]:
    """``other``'s lock held by another process (a convert writing it) for the test's duration."""
    code = ("import sys; from pathlib import Path; from hydra_edge.lock import exclusive\n"
            "with exclusive(Path(sys.argv[1]), 'bundle'):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(other / LOCK)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield other
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_expand_writes_a_new_folder_it_locks_while_writing(compact: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "files"
    real, locked = expand_module.artefact_bytes, []

    def artefact_bytes(bundle: Path, record: object) -> bytes:
        try:
            FileLock(out / LOCK).acquire(timeout=0)
        except Timeout:
            locked.append(record)
        return real(bundle, record)
    monkeypatch.setattr(expand_module, "artefact_bytes", artefact_bytes)
    code, output = expand(compact, out)
    assert code == 0, output
    manifest = read_manifest(compact)
    assert len(locked) == len(manifest.artefacts)
    expanded = read_manifest(out)
    assert [(a.file, a.sha256, a.compact) for a in expanded.artefacts] == \
        [(a.file, a.sha256, None) for a in manifest.artefacts]
    names = {name for a in manifest.artefacts for name in (a.file, a.golden["file"], a.golden["inputs_file"])}
    assert set(files_of(out)) == names | {MANIFEST, LOCK}


def test_expand_into_another_bundle_is_refused_and_changes_nothing(compact: Path, other: Path) -> None:
    before = files_of(other)
    line = refused(compact, other)
    assert line == (f"--out {other} holds a bundle ({other / MANIFEST}); expand writes a new one: choose a new or "
                    "empty folder for --out")
    assert files_of(other) == before


def test_expand_into_a_bundle_whose_lock_is_held_is_refused_and_changes_nothing(compact: Path, held: Path) -> None:
    before = files_of(held)
    assert refused(compact, held).startswith(f"--out {held} holds a bundle")
    assert files_of(held) == before


def test_expand_into_an_empty_folder_whose_lock_is_held_is_refused_naming_the_holder(compact: Path,
                                                                                     held: Path) -> None:
    """A convert that has just taken the lock of its new bundle and written nothing yet."""
    for path in held.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name != LOCK and not path.name.startswith(f"{LOCK}."):
            path.unlink()
    line = refused(compact, held)
    assert line.startswith(f"--out {held} is in use by pid ") and line.endswith(f"; {CHOOSE}")
    assert {p.name for p in held.iterdir()} <= {LOCK, f"{LOCK}.owner"}


def test_expand_refuses_an_out_holding_files_it_did_not_write(compact: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert refused(compact, out) == (f"--out {out} holds notes.txt, which expand did not write; expand writes a new "
                                     "bundle: choose a new or empty folder for --out")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # not even a lock file left


@pytest.mark.parametrize("inside", [".", "files"])
def test_expand_into_the_bundle_itself_is_refused(compact: Path, inside: str) -> None:
    before = files_of(compact)
    assert refused(compact, compact / inside).startswith(f"--out {compact / inside} is inside the bundle {compact}")
    assert files_of(compact) == before


def test_expand_writes_nothing_when_a_later_artefact_fails_its_check(compact: Path, tmp_path: Path) -> None:
    """The 6-head skeleton has one byte changed: the 3-head artefact, rebuilt first, is not written either."""
    h6 = read_manifest(compact).artefacts[1]
    skeleton = compact / read_recipe(compact / h6.compact.recipe).skeleton.file
    data = bytearray(skeleton.read_bytes())
    data[len(data) // 2] ^= 0x01
    skeleton.write_bytes(bytes(data))
    assert refused(compact, tmp_path / "files").startswith(f"{skeleton}: skeleton sha256 is ")
    assert not [p for p in (tmp_path / "files").rglob("*") if p.name != LOCK]


def _golden_name(bundle: Path, field: str) -> str:
    return read_manifest(bundle).artefacts[0].golden[field]


@pytest.mark.parametrize("field", ["file", "inputs_file"])
def test_a_golden_file_linked_to_outside_the_bundle_is_refused(compact: Path, tmp_path: Path, field: str) -> None:
    """A link to a private file beside the bundle (mode 0600, right bytes) is never copied into --out."""
    path = compact / _golden_name(compact, field)
    outside = tmp_path / "private" / path.name
    outside.parent.mkdir()
    path.rename(outside)
    outside.chmod(0o600)
    path.symlink_to(outside)
    assert refused(compact, tmp_path / "files").startswith(f"{path} is a link to {outside}, outside the bundle "
                                                          f"(golden.{field})")
    assert not (tmp_path / "files" / path.name).exists()


@pytest.mark.parametrize("field", ["file", "inputs_file"])
def test_a_tampered_golden_file_is_refused(compact: Path, tmp_path: Path, field: str) -> None:
    path = compact / _golden_name(compact, field)
    pair = load_golden(path)
    np.savez(path, **{k: v + 1 for k, v in pair.items()})  # a valid file, other values: only its sha256 tells
    assert refused(compact, tmp_path / "files").startswith(f"{path}: golden.{field} sha256 is ")
    assert not (tmp_path / "files" / path.name).exists()


@pytest.mark.parametrize("name", ["manifest", "golden"])
def test_a_fifo_in_the_bundle_is_one_line_and_never_blocks_expand(compact: Path, tmp_path: Path, name: str) -> None:
    path = compact / (MANIFEST if name == "manifest" else _golden_name(compact, "inputs_file"))
    path.unlink()
    os.mkfifo(path)
    line = without_blocking(lambda: refused(compact, tmp_path / "files"), path)
    assert isinstance(line, str) and f"{path} is a FIFO" in line, line


def test_a_manifest_naming_a_file_expand_keeps_for_itself_is_refused(compact: Path, tmp_path: Path) -> None:
    """A golden file named like the lock (its sha256 right: convert leaves an empty lock) would replace the
    lock expand holds in --out."""
    from hydra_edge.records.manifest import Manifest

    doc = read_manifest(compact).to_dict()
    doc["artefacts"][0]["golden"].update(file=LOCK, sha256=hashlib.sha256((compact / LOCK).read_bytes()).hexdigest())
    Manifest.from_dict(doc).write(compact)
    assert refused(compact, tmp_path / "files") == (f"{compact / MANIFEST} names a file {LOCK!r}, which expand keeps "
                                                    "for its own use; re-run hydra-edge convert into a new folder")
    assert not [p for p in (tmp_path / "files").rglob("*") if p.name != LOCK]


# Runs ``hydra-edge expand`` and SIGKILLs it at one step: just before the first rename into its staging
# folder, before the 2nd file is moved from staging into --out, before the manifest is, or right after it
# is (a whole bundle, expand not yet done). The steps are told by where a rename goes, not by how many.
KILLED_AT = """
import os, signal, sys
from pathlib import Path
from hydra_edge.cli import main

step, out = sys.argv[1], Path(sys.argv[2]).resolve()
real, moved = os.replace, []

def replace(src, dst, *args, **kwargs):
    src, dst = Path(src).resolve(), Path(dst).resolve()
    staged = src.parent != out and src.is_relative_to(out)
    into_out = staged and dst.is_relative_to(out) and not dst.relative_to(out).parts[0].startswith(".expand-")
    if ((step == "staging" and dst.parent != out and dst.is_relative_to(out))
            or (step == "moving" and into_out and dst.name != "manifest.json" and len(moved) == 1)
            or (step == "manifest" and dst == out / "manifest.json")):
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst, *args, **kwargs)
    moved.extend([dst] if into_out else [])
    if step == "done" and dst == out / "manifest.json":
        os.kill(os.getpid(), signal.SIGKILL)

os.replace = replace
main(["expand", "--bundle", sys.argv[3], "--out", str(out)])
"""


@pytest.mark.parametrize("step", ["staging", "moving", "manifest", "done"])
def test_a_rerun_after_expand_was_killed_finishes_what_it_left(compact: Path, tmp_path: Path, step: str) -> None:
    """kill -9 at any step of expand: --out holds nothing a rerun trips on, and the rerun writes the whole
    bundle, every file its manifest names with that sha256 and nothing else but the lock."""
    out = tmp_path / "files"
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, step, str(out), str(compact)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stdout + killed.stderr  # it did reach the step
    code, output = expand(compact, out)
    assert code == 0, output
    manifest = read_manifest(out)
    names = {name for a in manifest.artefacts for name in (a.file, a.golden["file"], a.golden["inputs_file"])}
    written = files_of(out)
    assert set(written) == names | {MANIFEST, LOCK}
    assert all(written[a.file] == a.sha256 for a in manifest.artefacts)


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", ".lock"])
def test_a_journal_naming_a_file_outside_the_bundle_is_refused_and_removes_nothing(compact: Path, tmp_path: Path,
                                                                                   name: str) -> None:
    """The journal a killed expand leaves says what a rerun removes: a name leading out of --out (or to the
    lock) is one line, and nothing is removed."""
    out = tmp_path / "files"
    out.mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    (out / expand_module.JOURNAL).write_text(f'["{name}"]')
    assert refused(compact, out) == (f"{out / expand_module.JOURNAL} names {name!r}, not a file of a bundle; "
                                     f"remove {out} and re-run expand")
    assert (tmp_path / "outside.txt").read_text() == "keep" and [p.name for p in out.iterdir()] == [expand_module.JOURNAL]
