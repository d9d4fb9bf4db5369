"""How a compact bundle rebuilds a head count's artefact (``*.recipe.json``, schema ``hydra-edge/recipe`` v1).

A compact bundle stores the largest head count's artefact whole (the *source*) and, for every
other head count, a *skeleton*: its artefact with the weight bytes that are slices of the
source's weights cut out. The recipe says where each hole is in the rebuilt file and which
slice of which source tensor fills it. The rebuilt file's sha256 is the manifest's, the one
verified at convert time. Format-agnostic: it names bytes, dtypes and shapes, never a runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Tuple, TypeVar, Union

import msgspec
from msgspec import Meta

from . import codec
from .fields import Heads, Name, NonNegative, Positive, Sha256, relative_path

SCHEMA = "hydra-edge/recipe"
SCHEMA_VERSION = 1
HINT = "re-run hydra-edge convert --layout compact into a new folder"
T = TypeVar("T")

# A numpy dtype string ("<f2", "|i1"): only those numpy has (no "<f1"), with their size in bytes last.
Dtype = Annotated[str, Meta(pattern=r"^[<>|](f[248]|[iu][1248]|b1)\Z")]
Span = Tuple[NonNegative, Positive]  # [start, stop) along one axis
MAX_AXES = 32  # numpy 1's most dimensions (2's: 64); a weight has a handful
Axes = Annotated[List[T], Meta(max_length=MAX_AXES)]


class Piece(msgspec.Struct, forbid_unknown_fields=True):
    """One file the rebuild reads, with the size and sha256 it must have."""

    file: str
    sha256: Sha256
    bytes: NonNegative

    def __post_init__(self) -> None:
        relative_path(self.file, ".file")


class Range(msgspec.Struct, forbid_unknown_fields=True):
    """A hole at ``offset`` of the rebuilt file, filled from a tensor of the source.

    The source tensor (``dtype``, ``shape``, C order) starts at ``source_offset`` of the source
    file; ``index`` gives, per axis, the contiguous spans to keep (qkv: three spans on axis 0).
    """

    offset: NonNegative
    source_offset: NonNegative
    dtype: Dtype
    shape: Axes[Positive]
    index: Axes[List[Span]]

    def __post_init__(self) -> None:
        if len(self.index) != len(self.shape):
            raise ValueError(f"`.index`: {len(self.index)} axes for a tensor of shape {self.shape}")
        for axis, (spans, size) in enumerate(zip(self.index, self.shape)):
            if not spans:
                raise ValueError(f"`.index[{axis}]`: no span")
            for start, stop in spans:
                if not start < stop <= size:
                    raise ValueError(f"`.index[{axis}]`: span [{start}, {stop}) is not inside an axis of {size}")

    def itemsize(self) -> int:
        return int(self.dtype[2:])

    def source_bytes(self) -> int:
        """Bytes of the whole source tensor."""
        n = self.itemsize()
        for size in self.shape:
            n *= size
        return n

    def hole_bytes(self) -> int:
        """Bytes the slice fills in the rebuilt file."""
        n = self.itemsize()
        for spans in self.index:
            n *= sum(stop - start for start, stop in spans)
        return n


class Recipe(msgspec.Struct, forbid_unknown_fields=True):
    """Skeleton + slices of the source -> the artefact with ``sha256`` (``ranges`` ordered by offset)."""

    heads: Heads
    artefact: Name  # the manifest's file name of the artefact this rebuilds
    skeleton: Piece
    source: Piece
    ranges: List[Range]
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        relative_path(self.artefact, ".artefact")
        end = 0
        for i, r in enumerate(self.ranges):
            if r.offset < end:
                raise ValueError(f"`.ranges[{i}].offset`: {r.offset} overlaps the range before it (ends at {end})")
            end = r.offset + r.hole_bytes()

    def rebuilt_bytes(self) -> int:
        """Size of the rebuilt artefact: the skeleton plus every hole."""
        return self.skeleton.bytes + sum(r.hole_bytes() for r in self.ranges)

    def encode(self, where: str) -> bytes:
        return codec.encode(self, Recipe, where, HINT)


def decode_recipe(data: bytes, where: str) -> Recipe:
    """A recipe's bytes as a checked ``Recipe``; one ``HydraEdgeError`` line naming ``where`` otherwise."""
    return codec.decode(data, Recipe, where, "recipe", HINT, (SCHEMA, SCHEMA_VERSION))


def read_recipe(path: Union[str, Path]) -> Recipe:
    return codec.read(path, Recipe, "recipe", HINT, (SCHEMA, SCHEMA_VERSION))
