"""The one way a record is read or written: msgspec against the record's schema, one line on error.

A reader gets a typed record or a single ``HydraEdgeError`` line: the file, the field path
(``$.artefacts[2].heads``), what was expected, and how to fix it (the record's hint). A writer
sends the record through the same schema before writing, so a file that would not read back
(NaN, a negative count, a path outside the bundle) is never written, and writing what was read
gives the same bytes.

The phone reads lut.json and the latency correction with its own reader (apps/android-demo/core:
StrictJson.kt); for every file both give the same verdict and name the same field, so both find a
file's first fault in one order (``decode``; docs/android.md, "The readers").
"""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Iterator, List, Optional, Tuple, Type, TypeVar, Union, get_args, get_origin

import msgspec

from ..atomic import NotARegularFile, TooLarge, read_limited
from ..errors import HydraEdgeError
from .fields import finite, locate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - devices on 3.9/3.10 read JSON records only; TOML is read on the host
    tomllib = None

# The most a record (manifest, recipe, calibration, lookup table, profile) may hold: they are KiB; a
# manifest of every head count in every format is ~100 KiB. A larger file is no record.
RECORD_MAX_BYTES = 8 << 20

T = TypeVar("T")
Schema = Tuple[str, int]  # (schema name, version) a JSON record carries in its first two keys


class _Header(msgspec.Struct):
    """The first two keys of a versioned record, read before anything else is trusted."""

    schema: Any = None
    schema_version: Any = None


def _one_line(error: str, where: str, hint: str) -> str:
    """``Expected `int`, got `str` - at `$.a[2]``` -> ``where: $.a[2]: expected `int`, got `str`; hint``."""
    path, message = locate(error)
    return f"{where}: {printable(path)}: {printable(message[:1].lower() + message[1:])}; {hint}"


# What would break the one line: control characters and line separators, as a file's keys and values may hold,
# and lone surrogates (from a \ud800 escape), which no terminal or log can encode.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with each control character, line separator or lone surrogate as Python writes it in a repr
    (``\\n``, ``\\x00``, ``\\u2028``, ``\\ud800``): a key or value quoted from a file stays on its error's one
    line and can be printed. The phone's reader escapes the same way (StrictJson.kt's ``printable``), so
    both name a field alike."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def _at(path: str, error: Union[str, Exception]) -> msgspec.ValidationError:
    """A check's error below ``path`` as msgspec words one at ``path`` (``... - at `$.a.b[2]```)."""
    inner, message = locate(str(error))
    return msgspec.ValidationError(f"{message} - at `{path}{inner[1:]}`")


def _check_header(header: Any, schema: Schema, where: str, what: str, hint: str,
                  error: Type[HydraEdgeError]) -> None:
    name, version = schema
    if not isinstance(header, dict):
        raise error(_one_line(str(_at("$", f"Expected `object`, got `{_kind(header)}`")), where, hint))
    got = _Header(header.get("schema"), header.get("schema_version"))
    if got.schema != name:
        raise error(f"{where}: $.schema: not a hydra-edge {what} (schema {got.schema!r}, expected {name!r}); {hint}")
    if got.schema_version != version:
        raise error(f"{where}: $.schema_version: {what} schema version {got.schema_version!r}, this hydra-edge "
                    f"reads version {version}; {hint}")


def decode(data: Union[bytes, str], type_: Type[T], where: str, what: str, hint: str,
           schema: Optional[Schema] = None, error: Type[HydraEdgeError] = HydraEdgeError) -> T:
    """A JSON document as ``type_``, its schema and version checked first; ``error`` in one line otherwise.

    The order a fault is found in is the phone's too (its Kotlin reader finds the same first fault):
    the text first (UTF-8, JSON, nesting, non-finite numbers, repeated keys; see ``parse``), then the
    header, then the fields in the schema's order (``in_schema_order``).
    """
    document = parse(data, where, what, hint, error)
    if schema is not None:
        _check_header(document, schema, where, what, hint, error)
    try:
        in_schema_order(document, type_, "$")
        return msgspec.convert(document, type_, strict=True, str_keys=True)  # JSON's keys are strings
    except msgspec.ValidationError as e:
        raise error(_one_line(str(e), where, hint)) from None


def convert(obj: Any, type_: Type[T], where: str, hint: str) -> T:
    """Plain data (a parsed TOML file) as ``type_``; ``error`` in one line otherwise.

    Strict: a TOML string is never taken for a bool or a number (``optional = "no"`` is an error).
    """
    try:
        finite(obj, "")
        return msgspec.convert(obj, type_, strict=True)
    except ValueError as e:  # msgspec's ValidationError, or finite()'s "`.a.b`: nan is not a finite number"
        raise HydraEdgeError(_one_line(str(e), where, hint)) from None
    except RecursionError:
        raise HydraEdgeError(f"{where} nests too deeply; {hint}") from None


# -- the text: the same grammar as the phone's reader (StrictJson.kt) -------------------------------

# More nested arrays and objects than this is no record (they nest 5 deep); both readers refuse it
# before anything else can overflow a stack.
MAX_DEPTH = 512
_BRACKETS = re.compile(r"[\[\]{}]")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


class _Object(dict):
    """A JSON object as ``json`` reads it; ``pairs``: all its (key, value) pairs in document order when a
    key repeats (the dict keeps the last value), so ``parse`` can name the repeat and every value."""

    pairs: Optional[List[Tuple[str, Any]]] = None


def _object(pairs: List[Tuple[str, Any]]) -> _Object:
    found = _Object(pairs)
    if len(found) < len(pairs):
        found.pairs = pairs
    return found


def parse(data: Union[bytes, str], where: str, what: str, hint: str,
          error: Type[HydraEdgeError] = HydraEdgeError) -> Any:
    """The document as plain data, or one ``error`` line naming the first fault of the text:

    invalid UTF-8, nesting deeper than ``MAX_DEPTH``, anything RFC 8259 refuses (lone surrogate
    escapes included, and integers longer than msgspec reads: 4300 characters), and only then the
    field that holds a NaN, an infinity or a number too large for a double (the last one, as
    Python's writer spells them), then the first repeated key: a record has one value per key, and
    a reader keeping the last would read what a person editing the first did not mean.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError as e:
        raise error(f"{where}: not valid UTF-8 (byte {e.start}: {e.reason}); {hint}") from None
    if _too_deep(text):
        raise error(f"{where}: nests arrays and objects more than {MAX_DEPTH} deep, as no hydra-edge {what} does; "
                    f"{hint}")
    try:
        msgspec.json.decode(text.encode("utf-8", "surrogatepass"))
    except (msgspec.DecodeError, msgspec.ValidationError) as e:  # ValidationError: a number out of range
        raise error(f"{where}: {printable(_non_finite(text) or f'not valid JSON ({e})')}; {hint}") from None
    document = json.loads(text, object_pairs_hook=_object)
    repeated = _first_repeated(document)
    if repeated:
        raise error(f"{where}: {printable(repeated)}; {hint}")
    return document


def _too_deep(text: str) -> bool:
    """More than ``MAX_DEPTH`` arrays and objects open at once (brackets inside strings do not count)."""
    depth = 0
    for m in _BRACKETS.finditer(_STRINGS.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _nodes(value: Any, path: str = "$") -> Iterator[Tuple[str, Any, Optional[str]]]:
    """Every value below ``value`` in document order: (its path, it, the key it repeats or None)."""
    stack = [(path, value, None)]
    while stack:
        where, v, repeats = stack.pop()
        yield where, v, repeats
        if isinstance(v, dict):
            seen: set = set()
            children = []
            for k, item in (v.pairs or v.items()) if isinstance(v, _Object) else v.items():
                children.append((f"{where}.{k}", item, k if k in seen else None))
                seen.add(k)
            stack.extend(reversed(children))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{where}[{i}]", item, None) for i, item in enumerate(v)]))


def _first_repeated(document: Any) -> Optional[str]:
    for where, _, repeats in _nodes(document):
        if repeats is not None:
            return f"{where}: key `{repeats}` appears twice in one object (a record has one value per key)"
    return None


def _non_finite(text: str) -> Optional[str]:
    """Where Python's json (which writes them) put a NaN or Infinity, or a number too large for a double
    (the last in the document), for the message; None if nowhere or the text is no JSON even so."""
    try:
        document = json.loads(text, object_pairs_hook=_object)
    except (ValueError, RecursionError):  # json's own decode errors: the document is malformed anyway
        return None
    found = [(where, v) for where, v, _ in _nodes(document) if isinstance(v, float) and not math.isfinite(v)]
    return f"{found[-1][0]}: {found[-1][1]} is not a finite number" if found else None


# -- the fields, in the schema's order --------------------------------------------------------------

def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "str", bool: "bool", int: "int", float: "float",
            type(None): "null"}.get(type(value), type(value).__name__)


_UNIONS = (Union, getattr(types, "UnionType", Union))  # Optional[X], and X | None on 3.10+


def in_schema_order(value: Any, type_: Any, path: str) -> None:
    """Check ``value`` against ``type_`` as msgspec does, but field by field in the order the schema
    declares them (a missing required field where it is declared, an unknown one after the known
    ones, a struct's own checks after its fields), so the first fault named is the one the phone's
    reader, which reads fields in that order, names too. msgspec.ValidationError at the fault.
    """
    origin, args = get_origin(type_), get_args(type_)
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        if not isinstance(value, dict):
            raise _at(path, f"Expected `object`, got `{_kind(value)}`")
        names = set()
        for field in msgspec.structs.fields(type_):
            names.add(field.encode_name)
            if field.encode_name in value:
                in_schema_order(value[field.encode_name], field.type, f"{path}.{field.encode_name}")
            elif field.required:
                raise _at(path, f"Object missing required field `{field.encode_name}`")
        unknown = [k for k in value if k not in names]
        if unknown and type_.__struct_config__.forbid_unknown_fields:
            raise _at(path, f"Object contains unknown field `{unknown[0]}`")
    elif origin in _UNIONS and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if value is not None and len(rest) == 1:
            return in_schema_order(value, rest[0], path)
    elif origin is Annotated and get_origin(args[0]) in (list, tuple) and isinstance(value, list):
        meta = [m for m in args[1:] if isinstance(m, msgspec.Meta)]
        for m in meta:
            if m.min_length is not None and len(value) < m.min_length:
                raise _at(path, f"Expected `array` of length >= {m.min_length}")
            if m.max_length is not None and len(value) > m.max_length:
                raise _at(path, f"Expected `array` of length <= {m.max_length}")
        return in_schema_order(value, args[0], path)
    elif origin in (list, tuple) and isinstance(value, list) and (origin is list or args[-1:] == (...,)):
        for i, item in enumerate(value):
            in_schema_order(item, args[0], f"{path}[{i}]")
        return
    try:
        # a leaf, or a struct's own checks (its __post_init__); JSON's keys are strings, read as the key type
        msgspec.convert(value, type_, strict=True, str_keys=True)
    except (msgspec.ValidationError, ValueError) as e:
        raise _at(path, e) from None


def read_bytes(path: Path, what: str, hint: str, error: Type[HydraEdgeError] = HydraEdgeError,
               max_bytes: int = RECORD_MAX_BYTES) -> bytes:
    """The bytes of ``path``, at most ``max_bytes``; one ``error`` line naming ``what`` otherwise.

    Every bundle file is read here or through ``read_limited`` the same way: a FIFO put where a
    manifest belongs must not hang the reader, nor a huge file fill its memory.
    """
    try:
        return read_limited(path, max_bytes)
    except FileNotFoundError:
        raise error(f"no {what} at {path}; {hint}") from None
    except (NotARegularFile, TooLarge) as e:
        raise error(f"cannot read {what}: {e}; {hint}") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}; {hint}") from None


def read(path: Union[str, Path], type_: Type[T], what: str, hint: str, schema: Optional[Schema] = None,
         error: Type[HydraEdgeError] = HydraEdgeError) -> T:
    """Read and check the JSON record at ``path``; a missing, unreadable or invalid file is one line."""
    path = Path(path)
    return decode(read_bytes(path, what, hint, error), type_, str(path), what, hint, schema, error)


def read_toml(path: Union[str, Path], type_: Type[T], what: str, hint: str) -> T:
    """Read and check the TOML record at ``path`` (target profiles, policies: host files)."""
    path = Path(path)
    data = read_bytes(path, what, hint, HydraEdgeError)
    try:
        parsed = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise HydraEdgeError(f"cannot read {what} {path}: {e}; {hint}") from None
    except RecursionError:
        raise HydraEdgeError(f"{path} nests too deeply to be a {what}; {hint}") from None
    return convert(parsed, type_, str(path), hint)


def encode(record: Any, type_: Type[Any], where: str, hint: str) -> bytes:
    """``record`` as indented JSON, after checking it against ``type_`` as a reader would.

    Numbers are normalised by the schema (an int in a float field is written as a float), so
    writing what was read gives the same bytes.
    """
    checked = msgspec.to_builtins(convert(msgspec.to_builtins(record), type_, where, hint))
    if isinstance(checked, dict) and "schema" in checked:  # the header first, where a person looks
        checked = {"schema": checked.pop("schema"), "schema_version": checked.pop("schema_version"), **checked}
    return msgspec.json.format(msgspec.json.encode(checked), indent=2) + b"\n"


def to_plain(record: msgspec.Struct, opaque: Tuple[str, ...] = ()) -> dict:
    """``record``'s fields as plain data, for a file that is no JSON (``torch.save``'s pickle): each field
    as ``msgspec.to_builtins`` writes it, except the ``opaque`` ones (objects msgspec cannot encode,
    such as torch tensors), which stay as they are; a field at its default is left out, as
    ``omit_defaults`` would, so a file written before the field existed reads back unchanged.
    """
    plain = {}
    for field in msgspec.structs.fields(record):
        value = getattr(record, field.name)
        if field.default is not msgspec.NODEFAULT and _same_value(value, field.default):
            continue
        plain[field.name] = value if field.name in opaque else msgspec.to_builtins(value)
    return plain


def _same_value(value: Any, default: Any) -> bool:
    """``value == default`` for the plain defaults a record has (None, numbers, strings, empty tuples),
    False for any other object, whose ``==`` may not be a bool (a tensor's is a tensor)."""
    if default is None or value is None:
        return value is default
    return type(value) is type(default) and isinstance(value, (bool, int, float, str, tuple)) and value == default
