"""Compaction on the host: a head count's artefact as a skeleton + a recipe over the largest artefact's bytes.

Format-agnostic: a format only supplies a *tensor map* of its files (where each weight tensor's raw
bytes start, its shape and numpy dtype; ``<format>.tensor_map``). Which part of a weight subnetwork
k uses comes from ``slicing.weight_index``; which source tensor holds which model parameter is
found by value (an exporter may rename weights, e.g. ONNX's ``onnx::MatMul_205``), in any order of
the parameter's axes (ONNX stores MatMul weights as [in, out], LiteRT a conv as [O, kh, kw, I]).

Quantised weights are not parameters: an integer tensor with a per-row scale in the map is
identified by its dequantised values (within half a step of the parameter). A per-row tensor
(scale, zero point: ``Tensor.rows_of``) is a function of its weight's rows, so it follows the
weight it belongs to: subnetwork k's scales are the largest artefact's at k's rows when the
quantisation is nested. A destination tensor becomes a hole only if the slice's bytes equal its
bytes, and the whole recipe is kept only if ``runtime.rebuild`` gives back the artefact byte for byte.
"""

from __future__ import annotations

import hashlib
import itertools
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
    # a 1-D tensor with one value per index of axis ``axis`` of the tensor named ``rows_of``: a per-channel
    # scale or zero point of a quantised weight
    rows_of: str | None = None
    axis: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, self.dtype, count=self.nbytes // self.dtype.itemsize, offset=self.offset
                             ).reshape(self.shape)


@dataclass(frozen=True)
class Source:
    """A source tensor identified as (a layout of) a model parameter's slice at the largest head count.

    For axis ``a`` of the tensor, ``axes[a]`` is the parameter's axis it runs along and ``positions[a]``
    the parameter's index at each step (a per-row tensor has one axis: its weight's rows).
    """

    tensor: Tensor
    name: str  # the model parameter it holds (or whose rows it describes)
    shape: tuple[int, ...]  # the parameter's shape as the tensor holds it (``_forms``)
    axes: tuple[int, ...]
    positions: tuple[np.ndarray, ...]


def _positions(index: tuple, shape: Sequence[int]) -> list[np.ndarray]:
    """``weight_index`` (slices and index tensors on leading axes) as explicit positions on every axis."""
    out = []
    for axis, size in enumerate(shape):
        i = index[axis] if axis < len(index) else slice(None)
        out.append(np.arange(size)[i] if isinstance(i, slice) else np.asarray(i, dtype=np.int64))
    return out


def _forms(param: np.ndarray, index: tuple) -> list[np.ndarray]:
    """The shapes an artefact may hold ``param`` in: its own and, for a kernel of more than two axes whose
    slice keeps every axis after the first whole, those axes merged: a patch convolution's kernel
    (D, C, p, p) exported as a fully-connected weight (D, C * p * p) over flattened patches."""
    if param.ndim > 2 and len(index) <= 1:
        return [param, param.reshape(param.shape[0], -1)]
    return [param]


def _spans(relative: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions as contiguous [start, stop) spans: [0, 1, 2, 8, 9] -> [(0, 3), (8, 10)]."""
    breaks = np.flatnonzero(np.diff(relative) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(relative, breaks)]


def _equal(values: np.ndarray, param: np.ndarray, step: np.ndarray | None) -> bool:
    """``values`` are ``param`` stored in their dtype: equal up to its rounding (``step``: a quantised
    tensor's per-element scale, its values dequantised; then within half a step).

    Not bitwise: a converter may round its own way (ONNX's fp16 conversion lifts values below fp16's
    smallest subnormal to it; LiteRT rounds ties away from zero). Only which parameter a tensor holds
    is decided here; a hole is made only where the artefacts' own bytes agree (``plan_ranges``).
    """
    if step is not None:
        return bool((np.abs(values - param) <= 0.5 * step * (1 + 1e-3) + 1e-12).all())
    if not np.issubdtype(values.dtype, np.floating):
        return np.array_equal(param.astype(values.dtype), values)
    return np.allclose(values.astype(np.float32), param, rtol=float(np.finfo(values.dtype).eps), atol=1e-6)


def _holds(values: np.ndarray, param: np.ndarray, step: np.ndarray | None) -> bool:
    if values.shape != param.shape:
        return False
    corner = tuple(slice(0, 4) for _ in values.shape)  # most candidates differ here: skip the full compare
    return (_equal(values[corner], param[corner], None if step is None else step[corner])
            and _equal(values, param, step))


def _layouts(values: np.ndarray, step: np.ndarray | None, sliced: np.ndarray,
             positions: list[np.ndarray]) -> Iterator[tuple[tuple[int, ...], tuple]]:
    """(parameter axis per tensor axis, positions per tensor axis) for each order of the parameter's axes
    in which ``values`` hold the slice."""
    for axes in itertools.permutations(range(sliced.ndim)):
        if tuple(sliced.shape[a] for a in axes) == values.shape and _holds(values, sliced.transpose(axes), step):
            yield axes, tuple(positions[a] for a in axes)


def _per_row(tensor: Tensor, row: Tensor, data: bytes) -> np.ndarray:
    """``row``'s values shaped to broadcast along its axis of ``tensor``."""
    shape = [1] * len(tensor.shape)
    shape[row.axis] = -1
    return row.array(data).reshape(shape)


def _dequantised(t: Tensor, rows: Sequence[Tensor], data: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    """A tensor's values as the model sees them, and for a quantised one its step per element.

    An integer tensor with a floating per-row tensor (its scale) is dequantised with it, less an
    integer per-row tensor (its zero point) if the map has one.
    """
    values = t.array(data)
    scales = [r for r in rows if np.issubdtype(r.dtype, np.floating) and r.shape == (t.shape[r.axis],)]
    if not np.issubdtype(t.dtype, np.integer) or len(scales) != 1:
        return values, None
    scale = _per_row(t, scales[0], data).astype(np.float32)
    zero = [r for r in rows if np.issubdtype(r.dtype, np.integer) and r.shape == (t.shape[r.axis],)]
    shifted = values.astype(np.float32) - (_per_row(t, zero[0], data) if zero else 0)
    return shifted * scale, np.broadcast_to(scale, values.shape)


def identify(tensors: Iterable[Tensor], data: bytes, params: Mapping[str, np.ndarray],
             index: Callable[[str, int], tuple], heads: int) -> list[Source]:
    """Every (tensor, parameter, layout) in which a tensor of the ``heads`` artefact equals a parameter's slice,
    and every per-row tensor of such a tensor (on the parameter's axis its rows run along).

    Equal values (zero biases, unit norms of an untrained model) give several sources for one tensor;
    ``plan_ranges`` takes the first whose slice has the destination's bytes.
    """
    sliced = []
    for name, param in params.items():
        kept = index(name, heads)
        for p in _forms(param, kept):
            pos = _positions(kept, p.shape)
            sliced.append((name, p.shape, p[np.ix_(*pos)], pos))
    tensors = list(tensors)
    rows: dict[str, list[Tensor]] = {}
    for t in tensors:
        if t.rows_of is not None:
            rows.setdefault(t.rows_of, []).append(t)
    found = []
    for t in tensors:
        if t.rows_of is not None:
            continue
        values, step = _dequantised(t, rows.get(t.name, []), data)
        for name, shape, s, pos in sliced:
            for axes, where in _layouts(values, step, s, pos):
                found.append(Source(t, name, shape, axes, where))
                found += [Source(r, name, shape, (axes[r.axis],), (where[r.axis],)) for r in rows.get(t.name, [])]
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
                index: Callable[[str, int], tuple], heads: int) -> list[Range]:
    """A range for each destination tensor whose bytes equal a slice of a source tensor, ordered by offset."""
    ranges = []
    positions: dict[tuple[str, tuple[int, ...]], list[np.ndarray]] = {}
    for t in dest:
        want = dest_data[t.offset:t.offset + t.nbytes]
        for s in sources:
            if s.tensor.dtype != t.dtype or len(s.tensor.shape) != len(t.shape):
                continue
            if (s.name, s.shape) not in positions:
                positions[s.name, s.shape] = _positions(index(s.name, heads), s.shape)
            spans = _relative([positions[s.name, s.shape][a] for a in s.axes], s.positions)
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


@dataclass(frozen=True)
class Largest:
    """The largest artefact of a variant, read, hashed and identified once for all its smaller head counts."""

    piece: Piece
    data: bytes
    sources: list[Source]


def largest(file: str, data: bytes, tensors: Sequence[Tensor], heads: int, params: Mapping[str, np.ndarray],
            index: Callable[[str, int], tuple]) -> Largest:
    return Largest(_piece(file, data), data, identify(tensors, data, params, index, heads))


def compact(heads: int, artefact: str, data: bytes, tensors: Sequence[Tensor], source: Largest,
            index: Callable[[str, int], tuple], skeleton_file: str) -> Compacted:
    """Skeleton and recipe of ``data`` (the ``heads`` artefact) over ``source``; verified by rebuilding.

    Raises ValueError (saying why) when no weight is a slice or the rebuild differs from ``data``.
    """
    ranges = plan_ranges(tensors, data, source.sources, source.data, index, heads)
    if not ranges:
        raise ValueError(f"no weight of {artefact} is a slice of {source.piece.file}'s")
    skeleton = skeleton_of(data, ranges)
    recipe = Recipe(heads=heads, artefact=artefact, skeleton=_piece(skeleton_file, skeleton),
                    source=source.piece, ranges=ranges)
    if splice(skeleton, source.data, recipe.ranges) != data:
        raise ValueError(f"rebuilding {artefact} from its skeleton and {source.piece.file} does not give its bytes")
    return Compacted(skeleton, recipe)
