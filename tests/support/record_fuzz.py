"""Fuzzing a record's fields: each typed field replaced by a wrong type, NaN, infinity, a huge or a
negative number, or removed, and the reader's one-line error checked to name the file and the field.

Every record the tools read (manifest, calibration, lut.json, target profile, policy, recipe) is
checked this way; the tests of each record say which fields are free-form, optional or signed.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hydra_edge.errors import HydraEdgeError

# Mutations of one value; "missing" removes the key.
BAD = {"wrong type": "six", "nan": math.nan, "inf": math.inf, "huge": 10**30, "negative": -7}


def fields(doc: Any, path: str = "$", keys: tuple = ()) -> Iterator[tuple[str, tuple]]:
    """(field path, key path) of every field, nested ones included."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        here = f"{path}.{k}" if isinstance(doc, dict) else f"{path}[{k}]"
        yield here, (*keys, k)
        yield from fields(v, here, (*keys, k))


MISSING = object()


def mutate(doc: Any, keys: tuple, value: Any) -> Any:
    out = copy.deepcopy(doc)
    parent = out
    for k in keys[:-1]:
        parent = parent[k]
    if value is MISSING:
        del parent[keys[-1]]
    else:
        parent[keys[-1]] = value
    return out


def value_at(doc: Any, keys: tuple) -> Any:
    for k in keys:
        doc = doc[k]
    return doc


def named(message: str, field: str) -> bool:
    """The message names ``field``; msgspec writes a value inside a table of free keys as ``[...]``."""
    tokens = re.findall(r"\.[^.\[]+|\[\d+\]", field[1:])
    pattern = re.escape("$") + "".join(
        f"(?:{re.escape(t)}|\\[\\.\\.\\.\\])" if t.startswith(".") else re.escape(t) for t in tokens)
    return re.search(pattern + r"(?![\w\[.])", message) is not None


def assert_one_line(read: Callable[[], Any], file: Path, field: str, error: type = HydraEdgeError) -> None:
    with pytest.raises(error) as e:
        read()
    message = str(e.value)
    assert "\n" not in message and str(file) in message, message
    assert not field or named(message, field), f"{field} not named in: {message}"


def typed_fields(doc: Any, free: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """Fields whose value has a schema (free-form tables, e.g. a device's own description, excluded)."""
    return [(p, k) for p, k in fields(doc) if not any(re.fullmatch(f, p) for f in free)]


def fuzz(doc: Any, free: tuple[str, ...], optional: tuple[str, ...], allow_negative: tuple[str, ...],
         write: Callable[[Any], Path], read: Callable[[], Any], error: type = HydraEdgeError) -> int:
    """Every mutation of every typed field is refused in one line naming file and field; returns the count.

    ``optional``: fields with a default (removing them is fine); ``allow_negative``: fields where a
    negative number is meaningful (°C, a gain in top-1).
    """
    checked = 0
    for path, keys in typed_fields(doc, free):
        required = not path.endswith("]") and not any(re.fullmatch(f, path) for f in optional)
        cases = {"missing": mutate(doc, keys, MISSING)} if required else {}
        for name, bad in BAD.items():
            if name == "negative" and any(re.fullmatch(f, path) for f in allow_negative):
                continue
            if name == "wrong type" and isinstance(value_at(doc, keys), str):
                bad = 7
            cases[name] = mutate(doc, keys, bad)
        for name, bad_doc in cases.items():
            file = write(bad_doc)
            with pytest.raises(error) as e:
                read()
                pytest.fail(f"{path} {name} was accepted")
            message = str(e.value)
            assert "\n" not in message and str(file) in message, (path, name, message)
            parent = path.rsplit(".", 1)[0] if name == "missing" else path
            header = "$.schema" in message
            ancestors = [parent[:m.start()] for m in re.finditer(r"[.\[]", parent)][1:]  # a check across fields
            assert header or any(named(message, p) for p in [parent, *ancestors]), (path, name, message)
            assert header or name != "missing" or f"`{keys[-1]}`" in message, (path, name, message)
            checked += 1
    return checked
