"""Reading one bundle file on the device: once, bounded, never through a link out of the bundle, its
sha256 checked on the bytes read, so what the caller uses is what was checked whatever happens to
the file afterwards. Engines (golden pairs) and the rebuild (recipes, skeletons, artefacts) share it.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from stat import S_ISREG
from typing import Any, Iterator

from ..errors import HydraEdgeError
from ..records.codec import read_bytes
from ..records.manifest import refuse_link_out
from ..records.recipe import Piece

FIX = "re-push the bundle or re-run hydra-edge convert"


def check_sha256(got: str, path: Path, what: str, sha256: str) -> None:
    if got != sha256:
        raise HydraEdgeError(f"{path}: {what} sha256 is {got[:12]}..., expected {sha256[:12]}...; {FIX}")


def checked(data: Any, path: Path, what: str, sha256: str) -> Any:
    check_sha256(hashlib.sha256(data).hexdigest(), path, what, sha256)
    return data


# A whole artefact is read into memory to be hashed and loaded as one: b16 in fp32 is ~350 MB.
ARTEFACT_MAX_BYTES = 4 << 30


def bundle_path(bundle: Path, name: str, what: str) -> Path:
    """The bundle file ``name``: a link leading out of the bundle is refused before anything is read."""
    path = bundle / name
    refuse_link_out(bundle, path, what)
    return path


@contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """An OSError while opening or mapping ``path`` as one line."""
    try:
        yield
    except FileNotFoundError:
        raise HydraEdgeError(f"{path}: {what} is missing; {FIX}") from None
    except OSError as e:
        raise HydraEdgeError(f"{path}: cannot read {what}: {e.strerror or e}; {FIX}") from None


def check_size(path: Path, stat: os.stat_result, piece: Piece, what: str) -> None:
    if not S_ISREG(stat.st_mode):
        raise HydraEdgeError(f"{path}: {what} is not a regular file (a FIFO, a folder or a device); {FIX}")
    if stat.st_size != piece.bytes:
        raise HydraEdgeError(f"{path}: {what} is {stat.st_size} bytes, the recipe says {piece.bytes}; {FIX}")


def bundle_bytes(bundle: Path, name: str, sha256: str, what: str, max_bytes: int) -> bytes:
    """The bundle file ``name`` (``what`` it is, for messages), read once and at most ``max_bytes``, its
    sha256 checked on the bytes read: they are what the caller uses, whatever happens to the file after."""
    path = bundle_path(bundle, name, what)
    return checked(read_bytes(path, what, FIX, max_bytes=max_bytes), path, what, sha256)
