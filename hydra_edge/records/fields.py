"""Constrained field types the records share, so a head count or a sha256 means one thing everywhere.

Bounds are declared on the type (msgspec checks them while decoding); the checks msgspec cannot
declare (a path that must stay inside its bundle) are functions a record's ``__post_init__`` calls.
Every float type here is bounded, which also refuses NaN and infinity.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Tuple

import msgspec
from msgspec import Meta

from ..formats import FORMATS

MAX_HEADS = 128  # far above any ViT's head count, far below what would exhaust memory
LARGE = 1e12  # the largest magnitude any measured or configured number may have

Heads = Annotated[int, Meta(ge=1, le=MAX_HEADS, description="a head count")]
Positive = Annotated[int, Meta(ge=1, le=1 << 40)]
Threads = Annotated[int, Meta(ge=1, le=1024)]
NonNegative = Annotated[int, Meta(ge=0, le=1 << 53)]
Finite = Annotated[float, Meta(ge=-LARGE, le=LARGE)]
NonNegFloat = Annotated[float, Meta(ge=0.0, le=LARGE)]
PosFloat = Annotated[float, Meta(gt=0.0, le=LARGE)]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]  # \Z: "$" would let a final newline through
Name = Annotated[str, Meta(min_length=1, max_length=4096)]
# The artefact formats the device runtime loads: the keys of the one format table (stdlib only, so
# boards read these records without numpy).
Format = Literal[tuple(FORMATS)]  # type: ignore[valid-type]


def relative_path(value: str, field: str) -> None:
    """``value`` names a file inside its bundle: relative, no ``..``, no NUL; ValueError otherwise.

    The message starts with the field's path below the record (``.golden.file``) so the one-line
    error names it exactly.
    """
    if not value or "\x00" in value or "\\" in value:
        raise ValueError(f"`{field}`: {value!r} is not a file name")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or value.startswith("~"):
        raise ValueError(f"`{field}`: {value!r} leaves the bundle; a record names files relative to its bundle")


def locate(error: str) -> Tuple[str, str]:
    """A msgspec error as (field path, message): ``Expected `int` - at `$.a[2]``` -> ``("$.a[2]", "Expected `int`")``.

    A check of ours (a ``__post_init__`` ValueError) starts its message with the path below the
    record it ran in (``"`.golden.file`: ..."``); it is joined to the path msgspec adds.
    """
    message, sep, at = error.rpartition(" - at `")
    path = at.rstrip("`") if sep else "$"
    message = message if sep else error
    if path.startswith("key` in `"):  # msgspec's words for a key of the table at a path: "at `key` in `$.a`"
        path, message = path[len("key` in `"):], f"{message} (a key)"
    while message.startswith(("`.", "`[")):
        inner, _, message = message[1:].partition("`: ")
        path += inner
    return path, message


def check(value: Any, type_: Any, field: str) -> None:
    """Check a mapping kept as a plain dict (for its readers) against its schema; ValueError naming ``field``."""
    try:
        msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as e:
        path, message = locate(str(e))
        raise ValueError(f"`{field}{path[1:]}`: {message}") from None
    finite(value, field)


def finite(value: Any, field: str) -> None:
    """No NaN or infinity anywhere below ``value``: JSON has no such numbers and tables compare them."""
    stack = [(value, field)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"`{where}`: {v} is not a finite number")
        if isinstance(v, dict):
            stack.extend((item, f"{where}.{k}") for k, item in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(v))

# Android's PowerManager.THERMAL_STATUS_* names, by value: what a policy's derating is indexed by and
# what the device's thermal service reports.
ANDROID_THERMAL_STATUSES = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")
