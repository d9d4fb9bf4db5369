"""Rebuild a compact bundle's artefact in memory: skeleton bytes + slices of the largest artefact's weights.

Device side (numpy and the standard library). Nothing is loaded whose bytes differ from what
was verified at convert time: the recipe, skeleton and source are checked against their sha256
first, every range is checked against the sizes of its source and of the rebuilt file before a
byte of either is read, and the rebuilt bytes are checked against the manifest's sha256 before
they are returned. A whole artefact is read once and its bytes hashed, so what is hashed is what
loads. Every file is read without blocking (a FIFO is refused, not waited on), at most the size
its record gives, and never through a link leading out of the bundle. Each failure is one
``HydraEdgeError`` line naming the file and what differs.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ..errors import HydraEdgeError
from ..records.codec import RECORD_MAX_BYTES, read_bytes
from ..records.manifest import ArtefactRecord
from ..records.recipe import Piece, Range, Recipe, decode_recipe
from .bundle_files import ARTEFACT_MAX_BYTES, FIX, bundle_bytes, bundle_path, check_sha256, check_size, checked, reading

if TYPE_CHECKING:
    from .engines import Engine


def _read_piece(bundle: Path, piece: Piece, what: str) -> bytes:
    """A skeleton: its size is compared before it is read (at most that many bytes), its sha256 after."""
    path = bundle_path(bundle, piece.file, what)
    with reading(path, what):
        check_size(path, path.stat(), piece, what)
    return bundle_bytes(bundle, piece.file, piece.sha256, what, piece.bytes)


# Sources whose sha256 this process has checked, by file identity: the largest artefact is read for
# every head count, and hashing it each time would cost more than the rebuild (b16: ~140 ms of ~220).
_VERIFIED: Dict[Tuple[int, int, int, int], str] = {}


def _map_source(bundle: Path, piece: Piece) -> Union[bytes, mmap.mmap]:
    """The source artefact, mapped (a rebuild touches only the slices it takes).

    Opened without blocking (a FIFO in its place is refused, not waited on) and identified by the
    open file, not its path. Its sha256 is checked on first use and again whenever that identity
    (device, inode, size, modification time) changes; the rebuilt bytes themselves are always hashed.
    """
    path = bundle_path(bundle, piece.file, "source artefact")
    with reading(path, "source artefact"):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            stat = os.fstat(fd)
            check_size(path, stat, piece, "source artefact")
            data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if piece.bytes else b""
        finally:
            os.close(fd)
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if _VERIFIED.get(key) != piece.sha256:
        checked(data, path, "source artefact", piece.sha256)
        _VERIFIED[key] = piece.sha256
    return data


def _check_ranges(recipe: Recipe, where: Path) -> None:
    """Every range inside its source tensor's file and inside the rebuilt file, fed by skeleton bytes in
    order (ranges in order and apart: the recipe's schema checks that when it is read)."""
    total, holes = recipe.rebuilt_bytes(), 0
    for i, r in enumerate(recipe.ranges):
        if r.source_offset + r.source_bytes() > recipe.source.bytes:
            raise HydraEdgeError(f"{where}: range {i} reads source bytes [{r.source_offset}, "
                                 f"{r.source_offset + r.source_bytes()}) beyond {recipe.source.file} "
                                 f"({recipe.source.bytes} bytes); {FIX}")
        if r.offset - holes > recipe.skeleton.bytes or r.offset + r.hole_bytes() > total:
            raise HydraEdgeError(f"{where}: range {i} writes bytes [{r.offset}, {r.offset + r.hole_bytes()}) "
                                 f"outside the {total}-byte artefact its skeleton and holes make; {FIX}")
        holes += r.hole_bytes()


def _source_tensor(source: Union[bytes, mmap.mmap], r: Range) -> np.ndarray:
    return np.frombuffer(source, dtype=np.dtype(r.dtype), count=r.source_bytes() // r.itemsize(),
                         offset=r.source_offset).reshape(r.shape)


def _fill(hole: np.ndarray, tensor: np.ndarray, index: List[List[Tuple[int, int]]], axis: int = 0) -> None:
    """Copy the spans of ``tensor`` (axes from ``axis`` on) into ``hole``, one block per span: no temporaries."""
    if axis == len(index):
        hole[...] = tensor
        return
    at = 0
    for start, stop in index[axis]:
        pick = (slice(None),) * axis
        _fill(hole[pick + (slice(at, at + stop - start),)], tensor[pick + (slice(start, stop),)], index, axis + 1)
        at += stop - start


def _gather(source: Union[bytes, mmap.mmap], r: Range) -> np.ndarray:
    """The range's spans of its source tensor, copied into a new C-order array (never a view of the source:
    a mapped file can change under a view after it was hashed)."""
    hole = np.empty([sum(stop - start for start, stop in spans) for spans in r.index], np.dtype(r.dtype))
    _fill(hole, _source_tensor(source, r), r.index)
    return hole


def slice_bytes(source: Union[bytes, mmap.mmap], r: Range) -> bytes:
    """The range's spans of its source tensor, as C-order bytes."""
    return _gather(source, r).tobytes()


def _pieces(skeleton: bytes, source: Union[bytes, mmap.mmap], ranges: List[Range]) -> Iterator[Any]:
    """The rebuilt file in order, as buffers no one else can change: skeleton runs and gathered slices."""
    skeleton_view = memoryview(skeleton)
    read = 0  # next skeleton byte
    written = 0  # next output byte
    for r in ranges:
        gap = r.offset - written
        yield skeleton_view[read:read + gap]
        read += gap
        yield memoryview(_gather(source, r).reshape(-1).view(np.uint8))
        written = r.offset + r.hole_bytes()
    yield skeleton_view[read:]


def splice(skeleton: bytes, source: Union[bytes, mmap.mmap], ranges: List[Range]) -> bytes:
    """The rebuilt file: skeleton bytes in order, each range's slice in its hole."""
    return b"".join(_pieces(skeleton, source, ranges))


HASH_BATCH = 1 << 20  # bytes handed to the hashing thread at a time: one hand-over costs as much as hashing 20 KB


def _hash_all(digest: Any, pieces: List[Any]) -> None:
    for piece in pieces:
        digest.update(piece)


def _splice_hashed(skeleton: bytes, source: Union[bytes, mmap.mmap], ranges: List[Range]) -> Tuple[bytes, str]:
    """``splice`` and the sha256 of what it returns, hashed piece by piece on a second thread while the
    next slices are gathered (hashlib and numpy's copies release the GIL). The pieces are private and
    never change, so their hash is the hash of the bytes joined from them."""
    digest = hashlib.sha256()
    pieces: List[Any] = []
    batch: List[Any] = []
    batched = 0
    with ThreadPoolExecutor(1, thread_name_prefix="rebuild-sha256") as hasher:  # one worker: in order
        for piece in _pieces(skeleton, source, ranges):
            pieces.append(piece)
            batch.append(piece)
            batched += piece.nbytes
            if batched >= HASH_BATCH:
                hasher.submit(_hash_all, digest, batch)
                batch, batched = [], 0
        hasher.submit(_hash_all, digest, batch)
        data = b"".join(pieces)
    return data, digest.hexdigest()


def recipe_of(bundle: Union[str, Path], record: ArtefactRecord) -> Recipe:
    """The record's recipe, checked against the manifest's sha256, head count, file name and size."""
    assert record.compact is not None
    bundle = Path(bundle)
    path = bundle / record.compact.recipe
    recipe = decode_recipe(bundle_bytes(bundle, record.compact.recipe, record.compact.sha256, "recipe",
                                        RECORD_MAX_BYTES), str(path))
    if (recipe.heads, recipe.artefact, recipe.rebuilt_bytes()) != (record.heads, record.file, record.bytes):
        raise HydraEdgeError(f"{path}: rebuilds {recipe.artefact} ({recipe.heads} heads, {recipe.rebuilt_bytes()} "
                             f"bytes), the manifest names {record.file} ({record.heads} heads, {record.bytes} bytes); "
                             f"{FIX}")
    return recipe


def rebuild(bundle: Union[str, Path], record: ArtefactRecord) -> bytes:
    """The bytes of ``record``'s artefact, rebuilt from its recipe; its sha256 is the manifest's."""
    bundle = Path(bundle)
    recipe = recipe_of(bundle, record)
    _check_ranges(recipe, bundle / record.compact.recipe)
    skeleton = _read_piece(bundle, recipe.skeleton, "skeleton")
    source = _map_source(bundle, recipe.source)
    data, got = _splice_hashed(skeleton, source, recipe.ranges)
    check_sha256(got, bundle / record.compact.recipe, f"artefact {record.file} rebuilt by the recipe", record.sha256)
    return data


def _whole(bundle: Path, record: ArtefactRecord) -> bytes:
    """A full artefact's file, read once (at most the manifest's size) and hashed: the bytes checked are
    the bytes returned, whatever happens to the file after."""
    path = bundle_path(bundle, record.file, "artefact")
    data = read_bytes(path, "artefact", FIX, max_bytes=min(record.bytes, ARTEFACT_MAX_BYTES))
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise HydraEdgeError(f"{path} is missing or its sha256 differs from the manifest; {FIX}")
    return data


def artefact_bytes(bundle: Union[str, Path], record: ArtefactRecord) -> bytes:
    """The verified bytes of ``record``'s artefact, from its file or rebuilt; sha256 checked either way."""
    return _whole(Path(bundle), record) if record.compact is None else rebuild(bundle, record)


def load_record(bundle: Union[str, Path], record: ArtefactRecord, threads: int) -> "Engine":
    """``record``'s artefact in its runtime, loaded from the bytes whose sha256 was checked (a compact one
    rebuilt in memory, a full one read once): a file swapped after its check is never what runs."""
    return load_timed(bundle, record, threads)[0]


def load_timed(bundle: Union[str, Path], record: ArtefactRecord, threads: int) -> Tuple["Engine", Optional[float]]:
    """``load_record``, and the seconds its rebuild took (None for a full artefact): a switch that
    misses the cache pays it on top of the load, so calibration records it."""
    from .engines import load_bytes

    start = time.perf_counter()
    data = artefact_bytes(bundle, record)
    seconds = None if record.compact is None else time.perf_counter() - start
    return load_bytes(data, record.file, threads, record.format, record.runtime), seconds
