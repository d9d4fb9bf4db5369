"""The one way a record is read or written: msgspec against the record's schema, one line on error.

A reader gets a typed record or a single ``HydraEdgeError`` line: the file, the field path
(``$.artefacts[2].heads``), what was expected, and how to fix it (the record's hint). A writer
sends the record through the same schema before writing, so a file that would not read back
(NaN, a negative count, a path outside the bundle) is never written, and writing what was read
gives the same bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Tuple, Type, TypeVar, Union

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
    return f"{where}: {path}: {message[:1].lower()}{message[1:]}; {hint}"


def _check_header(header: Any, schema: Schema, where: str, what: str, hint: str,
                  error: Type[HydraEdgeError]) -> None:
    name, version = schema
    got = header if isinstance(header, _Header) else _Header()
    if got.schema != name:
        raise error(f"{where}: $.schema: not a hydra-edge {what} (schema {got.schema!r}, expected {name!r}); {hint}")
    if got.schema_version != version:
        raise error(f"{where}: $.schema_version: {what} schema version {got.schema_version!r}, this hydra-edge "
                    f"reads version {version}; {hint}")


def decode(data: Union[bytes, str], type_: Type[T], where: str, what: str, hint: str,
           schema: Optional[Schema] = None, error: Type[HydraEdgeError] = HydraEdgeError) -> T:
    """A JSON document as ``type_``, its schema and version checked first; ``error`` in one line otherwise."""
    try:
        if schema is not None:
            _check_header(msgspec.json.decode(data, type=_Header), schema, where, what, hint, error)
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as e:
        raise error(_one_line(str(e), where, hint)) from None
    except msgspec.DecodeError as e:
        raise error(f"{where}: {_non_finite(data) or f'not valid JSON ({e})'}; {hint}") from None
    except RecursionError:
        raise error(f"{where} nests too deeply to be a hydra-edge {what}; {hint}") from None


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


def _non_finite(data: Union[bytes, str]) -> Optional[str]:
    """Where Python's json (which writes them) put a NaN or Infinity, for the message; None if nowhere."""
    try:
        finite(json.loads(data), "")
    except ValueError as e:  # json's own decode errors too: then the document is malformed anyway
        if str(e).startswith(("`.", "`[")):
            path, message = locate(str(e))
            return f"{path}: {message}"
    except RecursionError:
        pass
    return None


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
