"""Fuzzing a record's fields: each typed field replaced by a wrong type, NaN, infinity, a huge or a
negative number, or removed, and the reader's one-line error checked to name the file and the field.

Every record the tools read (manifest, calibration, lut.json, target profile, policy, recipe) is
checked this way; the tests of each record say which fields are free-form, optional or signed.

``mutated_file`` goes further for the records the phone reads too (lut.json, the latency correction):
whole files with random faults, structural and byte-level, several at once, that Python's reader and
the Kotlin one must give the same verdict on, naming the same field (tests/test_reader_parity.py).
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Tuple

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


# -- whole files, mutated at random: what the two readers of a record (Python's and the phone's) must agree on

SURROGATES = ("\\ud800", "\\udc00", "\\ud800\\u0041", "\\udbff\\ud800", "\\ud800x")
INVALID_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82")
NON_FINITE = ("NaN", "-NaN", "Infinity", "-Infinity", "nan", "inf", "1e400", "-1e400", "1e309", "+1", "1.", ".5", "01",
              "0x10", "1e", "--1", "1" + "0" * 4299, "-1" + "0" * 4298, "-1" + "0" * 4299, "1" + "0" * 4300,
              "1." + "0" * 5000,
              "1e" + "9" * 5000)
HUGE = (10**30, -(10**30), 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**400, 1e12, 1000000000001.0,
        1e300, -1e300, 5e-324, -0.0, 1e-7)
# A value standing in for a lone surrogate escape until the text is written (json.dumps escapes it as below).
_SURROGATE = "\x00surrogate\x00"


def _swap(value: Any, rng: random.Random) -> Any:
    """Another JSON type (or a boundary of the same), for a type swap."""
    return rng.choice(["six", "", 7, 0, -1, 1.5, -0.0, True, False, None, [], {}, [value], {"x": value}, 128, 129,
                       1024, 1025, 100.0, 100.5, 1000.0, 1000.5, "a" * 64, "A" * 64, "../x", "/x", "x\\y", "~x",
                       "hydra-edge/lut", "hydra-edge/latency-correction", *HUGE[:4]])


def _boundary(value: Any, rng: random.Random, doc: Any) -> Any:
    """A value at or just past a range the schema bounds this kind of field by."""
    listed = doc.get("candidates") if isinstance(doc, dict) else None
    candidates = len(listed) if isinstance(listed, list) else 4
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([0, 1, -1, candidates, candidates - 1, candidates + 1, 127, 128, 129, 1023, 1024, 1025,
                           2**40, 2**40 + 1, 2**53, 2**53 + 1, value + 1, value - 1])
    if isinstance(value, float):
        return rng.choice([0.0, -0.0, -1e-9, 1e-9, 1.0, 0.999, 100.0, 100.0000001, 1000.0, 1000.0001, 1e6, 1e6 + 1,
                           1e12, 1e12 * (1 + 1e-15), -1e12, -1.0000001e12, 1e300, -273.15, -273.16, value * 2,
                           -value])
    if isinstance(value, str):
        return rng.choice(["", "x", value + "\n", value.upper(), value[:-1], "a" * 4097, "a" * 4096, "é", "🐍",
                           _SURROGATE])
    if isinstance(value, list):
        return rng.choice([[], value[:-1], value + value[-1:], list(reversed(value)), value * 2, [value]])
    return {}


def mutate_structure(doc: Any, rng: random.Random, only: str = ".*") -> Tuple[Any, Dict[str, Any]]:
    """One structural fault (a type swap, a boundary value, a key removed or added) at a random field whose
    path matches ``only``; also, sometimes, a key to write twice (``repeats``: object path -> (key, first
    value, first or last))."""
    out = copy.deepcopy(doc)
    repeats: Dict[str, Any] = {}
    places = [(path, keys) for path, keys in fields(out) if re.fullmatch(only, path)]
    if not places:
        return out, repeats
    path, keys = rng.choice(places)
    parent = value_at(out, keys[:-1])
    key = keys[-1]
    kind = rng.choice(["swap", "boundary", "boundary", "remove", "extra", "repeat"])
    if kind == "swap":
        parent[key] = _swap(parent[key], rng)
    elif kind == "boundary":
        parent[key] = _boundary(parent[key], rng, out)
    elif kind == "remove":
        del parent[key]
    elif kind == "extra":
        target = parent if isinstance(parent, dict) else parent[key] if isinstance(parent[key], dict) else None
        if target is not None:
            target[rng.choice(["extra", "Schema", "heads ", "", _SURROGATE])] = rng.choice([1, None, "x", []])
        elif isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[key]))
    elif kind == "repeat" and isinstance(parent, dict):
        good = copy.deepcopy(parent[key])
        first = rng.choice([good, _swap(good, rng), _boundary(good, rng, out), {"x": 1}, [1, "x"], {}, []])
        repeats[path.rsplit(".", 1)[0]] = (key, first, rng.choice(["first", "last"]))
    return out, repeats


def dumps(value: Any, rng: random.Random, repeats: Dict[str, Any], path: str = "$", indent: int = 0) -> str:
    """JSON text for ``value`` as a writer might lay it out (indented or not), a key written twice where
    ``repeats`` says, and lone surrogate escapes where a value or key holds the stand-in."""
    def text(s: str) -> str:
        quoted = json.dumps(s)
        return quoted.replace(json.dumps(_SURROGATE)[1:-1], rng.choice(SURROGATES))
    pad = "\n" + " " * (indent + 2) if indent >= 0 else ""
    end = "\n" + " " * indent if indent >= 0 else ""
    inner = indent + 2 if indent >= 0 else -1
    if isinstance(value, dict):
        items = [(k, v, f"{path}.{k}") for k, v in value.items()]
        if path in repeats:
            key, first, where = repeats[path]
            extra = (key, first, f"{path}.{key}")
            at = next((i for i, item in enumerate(items) if item[0] == key), len(items))
            items.insert(at if where == "first" else at + 1, extra)
        body = [f"{pad}{text(k)}: {dumps(v, rng, repeats, p, inner)}" for k, v, p in items]
        return "{" + ",".join(body) + (end if body else "") + "}"
    if isinstance(value, list):
        body = [f"{pad}{dumps(v, rng, repeats, f'{path}[{i}]', inner)}" for i, v in enumerate(value)]
        return "[" + ",".join(body) + (end if body else "") + "]"
    if isinstance(value, str):
        return text(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return repr(value)
    return json.dumps(value)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One byte-level fault: a bit flipped, bytes deleted or inserted, the end cut, invalid UTF-8, a lone
    surrogate escape, a non-finite or malformed number, or a value nested deeply."""
    kind = rng.choice(["flip", "delete", "insert", "truncate", "utf8", "surrogate", "number", "nest", "nest"])
    at = rng.randrange(len(data) + 1) if data else 0
    if kind == "flip" and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:]
    if kind == "delete":
        return data[:at] + data[at + rng.randint(1, 8):]
    if kind == "insert":
        return data[:at] + rng.choice([b",", b"}", b"]", b"{", b"[", b'"', b"\\", b" ", b"\x00", b"\t", b"\xef\xbb\xbf",
                                       b"\xc2\xa0", b"null", b"1"]) + data[at:]
    if kind == "truncate":
        return data[:at]
    if kind == "utf8":
        return data[:at] + rng.choice(INVALID_UTF8) + data[at:]
    quotes = [i for i in range(len(data)) if data[i:i + 1] == b'"']
    if kind == "surrogate" and quotes:
        q = rng.choice(quotes) + 1
        return data[:q] + rng.choice(SURROGATES).encode() + data[q:]
    numbers = [m.span() for m in re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", data)]
    if kind == "number" and numbers:
        a, b = rng.choice(numbers)
        return data[:a] + rng.choice(NON_FINITE).encode() + data[b:]
    if kind == "nest" and numbers:
        a, b = rng.choice(numbers)
        depth = rng.choice([1, 100, 511, 512, 513, 600, 5000])
        return data[:a] + b"[" * depth + data[a:b] + b"]" * depth + data[b:]
    return data[:at] + b"\xff" + data[at:]


def mutated_file(doc: Any, rng: random.Random, only: str = ".*", most: int = 4) -> bytes:
    """A record ``doc`` with one to ``most`` faults, structural (at fields matching ``only``) and byte-level
    mixed, or none: then it is read."""
    repeats: Dict[str, Any] = {}
    faults = min(rng.choice([0, 1, 1, 1, 2, 2, 3, 4]), most)
    byte_faults = 0
    for _ in range(faults):
        if rng.random() < 0.6:
            doc, more = mutate_structure(doc, rng, only)
            repeats.update(more)
        else:
            byte_faults += 1
    data = dumps(doc, rng, repeats, indent=rng.choice([2, -1])).encode("utf-8", "surrogatepass")
    for _ in range(byte_faults):
        data = mutate_bytes(data, rng)
    return data
