"""Compaction on the host: a head count's artefact as a skeleton + a recipe over the largest artefact's bytes.

Format-agnostic: a format only supplies a *tensor map* of its files (where each weight tensor's raw
bytes start, its shape and numpy dtype; ``<format>.tensor_map``). Which part of a weight subnetwork
k uses comes from ``slicing.weight_index``; which source tensor holds which model parameter is
found by value (an exporter may rename weights, e.g. ONNX's ``onnx::MatMul_205``), in either the
parameter's layout or transposed (ONNX stores MatMul weights as [in, out]). A destination tensor
becomes a hole only if the slice's bytes equal its bytes, and the whole recipe is kept only if
``runtime.rebuild`` gives back the artefact byte for byte.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..records.recipe import Piece, Range, Recipe
from ..runtime.rebuild import slice_bytes, splice


@dataclass(frozen=True)
class Tensor:
    """A weight tensor's raw bytes in an artefact file: ``data[offset : offset + nbytes]``, C order."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, self.dtype, count=self.nbytes // self.dtype.itemsize, offset=self.offset
                             ).reshape(self.shape)


@dataclass(frozen=True)
class Source:
    """A source tensor identified as (a layout of) a model parameter's slice at the largest head count.

    ``positions[a]``: for axis ``a`` of the tensor, the parameter's index along the matching axis.
    """

    tensor: Tensor
    name: str  # the model parameter it holds
    transposed: bool
    positions: tuple[np.ndarray, ...]


def _positions(index: tuple, shape: Sequence[int]) -> list[np.ndarray]:
    """``weight_index`` (slices and index tensors on leading axes) as explicit positions on every axis."""
    out = []
    for axis, size in enumerate(shape):
        i = index[axis] if axis < len(index) else slice(None)
        out.append(np.arange(size)[i] if isinstance(i, slice) else np.asarray(i, dtype=np.int64))
    return out


def _spans(relative: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions as contiguous [start, stop) spans: [0, 1, 2, 8, 9] -> [(0, 3), (8, 10)]."""
    breaks = np.flatnonzero(np.diff(relative) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(relative, breaks)]


def _holds(values: np.ndarray, param: np.ndarray) -> bool:
    """``values`` are ``param`` stored in their dtype: equal up to its rounding.

    Not bitwise: a converter may round its own way (ONNX's fp16 conversion lifts values below fp16's
    smallest subnormal to it). Only which parameter a tensor holds is decided here; a hole is made
    only where the artefacts' own bytes agree (``plan_ranges``).
    """
    if values.shape != param.shape:
        return False
    corner = tuple(slice(0, 4) for _ in values.shape)  # most candidates differ here: skip the full compare
    return _equal(values[corner], param[corner]) and _equal(values, param)


def _equal(values: np.ndarray, param: np.ndarray) -> bool:
    if not np.issubdtype(values.dtype, np.floating):
        return np.array_equal(param.astype(values.dtype), values)
    return np.allclose(values.astype(np.float32), param, rtol=float(np.finfo(values.dtype).eps), atol=1e-6)


def _layouts(values: np.ndarray, sliced: np.ndarray, positions: list[np.ndarray]) -> Iterator[tuple[bool, tuple]]:
    """(transposed, positions per axis of ``values``) for each layout in which ``values`` hold the slice."""
    for transposed, view, where in ((False, sliced, positions), (True, sliced.T, positions[::-1])):
        if _holds(values, view):
            yield transposed, tuple(where)


def identify(tensors: Iterable[Tensor], data: bytes, params: Mapping[str, np.ndarray],
             index: Callable[[str, int], tuple], heads: int) -> list[Source]:
    """Every (tensor, parameter, layout) in which a tensor of the ``heads`` artefact equals a parameter's slice.

    Equal values (zero biases, unit norms of an untrained model) give several sources for one tensor;
    ``plan_ranges`` takes the first whose slice has the destination's bytes.
    """
    sliced = {}
    for name, p in params.items():
        pos = _positions(index(name, heads), p.shape)
        sliced[name] = (p[np.ix_(*pos)], pos)
    found = []
    for t in tensors:
        values = t.array(data)
        found += [Source(t, name, transposed, where) for name, (s, pos) in sliced.items()
                  for transposed, where in _layouts(values, s, pos)]
    return found


def _relative(want: Sequence[np.ndarray], have: Sequence[np.ndarray]) -> list[list[tuple[int, int]]] | None:
    """Per axis, the spans of ``have``'s positions that hold ``want``'s (both sorted); None if one is missing."""
    out = []
    for w, h in zip(want, have):
        rel = np.searchsorted(h, w)
        if not (rel < len(h)).all() or not np.array_equal(h[rel], w):
            return None
        out.append(_spans(rel))
    return out


def plan_ranges(dest: Iterable[Tensor], dest_data: bytes, sources: Sequence[Source], source_data: bytes,
                params_shape: Mapping[str, Sequence[int]], index: Callable[[str, int], tuple],
                heads: int) -> list[Range]:
    """A range for each destination tensor whose bytes equal a slice of a source tensor, ordered by offset."""
    ranges = []
    for t in dest:
        want = dest_data[t.offset:t.offset + t.nbytes]
        for s in sources:
            if s.tensor.dtype != t.dtype or len(s.tensor.shape) != len(t.shape):
                continue
            pos = _positions(index(s.name, heads), params_shape[s.name])
            spans = _relative(pos[::-1] if s.transposed else pos, s.positions)
            if spans is None or tuple(sum(b - a for a, b in ax) for ax in spans) != t.shape:
                continue
            r = Range(offset=t.offset, source_offset=s.tensor.offset, dtype=t.dtype.str,
                      shape=list(s.tensor.shape), index=[list(ax) for ax in spans])
            if slice_bytes(source_data, r) == want:
                ranges.append(r)
                break
    return sorted(ranges, key=lambda r: r.offset)


def skeleton_of(data: bytes, ranges: Sequence[Range]) -> bytes:
    """``data`` without the ranges' bytes: what the bundle stores for it."""
    kept, at = [], 0
    for r in ranges:
        kept.append(data[at:r.offset])
        at = r.offset + r.hole_bytes()
    kept.append(data[at:])
    return b"".join(kept)


def _piece(file: str, data: bytes) -> Piece:
    return Piece(file=file, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


@dataclass(frozen=True)
class Compacted:
    skeleton: bytes
    recipe: Recipe


def compact(heads: int, artefact: str, data: bytes, tensors: Sequence[Tensor], source_file: str,
            source_data: bytes, source_tensors: Sequence[Tensor], source_heads: int,
            params: Mapping[str, np.ndarray], index: Callable[[str, int], tuple], skeleton_file: str) -> Compacted:
    """Skeleton and recipe of ``data`` (the ``heads`` artefact) over ``source_data``; verified by rebuilding.

    Raises ValueError (saying why) when no weight is a slice or the rebuild differs from ``data``.
    """
    sources = identify(source_tensors, source_data, params, index, source_heads)
    shapes = {name: p.shape for name, p in params.items()}
    ranges = plan_ranges(tensors, data, sources, source_data, shapes, index, heads)
    if not ranges:
        raise ValueError(f"no weight of {artefact} is a slice of {source_file}'s")
    skeleton = skeleton_of(data, ranges)
    recipe = Recipe(heads=heads, artefact=artefact, skeleton=_piece(skeleton_file, skeleton),
                    source=_piece(source_file, source_data), ranges=ranges)
    if splice(skeleton, source_data, recipe.ranges, recipe.rebuilt_bytes()) != data:
        raise ValueError(f"rebuilding {artefact} from its skeleton and {source_file} does not give its bytes")
    return Compacted(skeleton, recipe)
