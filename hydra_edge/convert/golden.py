"""Golden pairs in a bundle: the inputs stored once when every head count checks the same ones.

Each head count's golden pair holds the same inputs (a few images, megabytes at b16) and its own small
outputs (reference and host logits). A compact bundle keeps the inputs in one shared
``golden-inputs.<digest>.npz`` and per head count a ``<artefact>.golden-outputs.npz``; the
record's ``golden.inputs_file`` names the shared file and its sha256. ``--layout full`` writes the
self-contained ``<artefact>.golden.npz`` again. As with artefacts, new files are written, then the
manifest, then the old files removed, so an interrupted run leaves a bundle that reads.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any, Dict

import msgspec
import numpy as np

from ..atomic import sha256_file, write_bytes
from ..records.manifest import ArtefactRecord, Manifest
from ..runtime.engines import load_golden, load_golden_pair

SHARED = ("golden-inputs.", ".npz")  # prefix and suffix of a shared inputs file
OUTPUTS = ".golden-outputs.npz"


def golden_name(file: str) -> str:
    """The self-contained golden pair of artefact ``file``: inputs, reference and host outputs."""
    return f"{Path(file).stem}.golden.npz"


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _digest(a: np.ndarray) -> str:
    """Names the shared file by the inputs' values (an .npz's own bytes carry a timestamp)."""
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _put(manifest: Manifest, out: Path, record: ArtefactRecord, golden: Dict[str, Any], old: str) -> None:
    manifest.put(msgspec.structs.replace(record, golden=golden))
    manifest.write(out)
    if old != golden["file"]:
        (out / old).unlink(missing_ok=True)


def share_inputs(out: Path, manifest: Manifest) -> None:
    """Every golden pair's inputs moved to a file shared by all pairs with equal inputs."""
    for record in list(manifest.artefacts):
        golden = record.golden
        if golden.get("inputs_file") is not None:
            continue
        pair = load_golden(out / golden["file"])
        inputs = pair.pop("inputs")
        name = f"{SHARED[0]}{_digest(inputs)}{SHARED[1]}"
        known = {g["inputs_file"]: g["inputs_sha256"] for g in (a.golden for a in manifest.artefacts)
                 if g.get("inputs_file") is not None}
        if name not in known or not (out / name).is_file() or sha256_file(out / name) != known[name]:
            write_bytes(out / name, npz_bytes(inputs=inputs))
        outputs = out / f"{Path(record.file).stem}{OUTPUTS}"
        write_bytes(outputs, npz_bytes(**pair))
        _put(manifest, out, record, {**golden, "file": outputs.name, "sha256": sha256_file(outputs),
                                     "inputs_file": name, "inputs_sha256": sha256_file(out / name)}, golden["file"])
    _remove_unreferenced(out, manifest)


def unshare_inputs(out: Path, manifest: Manifest) -> None:
    """Every golden pair self-contained again (``<artefact>.golden.npz``), as ``--layout full`` writes them."""
    for record in list(manifest.artefacts):
        golden = record.golden
        if golden.get("inputs_file") is None:
            continue
        path = out / golden_name(record.file)
        write_bytes(path, npz_bytes(**load_golden_pair(out, golden)))
        rest = {k: v for k, v in golden.items() if k not in ("inputs_file", "inputs_sha256")}
        _put(manifest, out, record, {**rest, "file": path.name, "sha256": sha256_file(path)}, golden["file"])
    _remove_unreferenced(out, manifest)


def _remove_unreferenced(out: Path, manifest: Manifest) -> None:
    """Shared inputs and outputs-only files no record names (left by a re-run or an interrupted one)."""
    named = {a.golden["file"] for a in manifest.artefacts} | {a.golden.get("inputs_file") for a in manifest.artefacts}
    for path in [*out.glob(f"{SHARED[0]}*{SHARED[1]}"), *out.glob(f"*{OUTPUTS}")]:
        if path.name not in named:
            path.unlink(missing_ok=True)
