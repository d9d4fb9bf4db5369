"""Files: atomic writes (a reader sees the old file or the new one, never half of either), the
bounded reads and sha256 hashes that pair with them. Standard library only: devices use it too."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import HydraEdgeError

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once at import: os.umask can only be read by setting it


def check_outputs(*paths: str | Path) -> None:
    """Refuse, before any work is done, an output file whose path names a folder.

    ``atomic_path`` would find out only at its rename, after the work (an epoch of training) and
    after the outputs written before it: a command checks all of its outputs first with this.
    """
    for path in map(Path, paths):
        if path.is_dir():
            raise _a_folder(path)


def _a_folder(path: Path) -> HydraEdgeError:
    return HydraEdgeError(f"{path} is a folder, where an output file goes; move it away or choose another output")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``."""
    path = Path(path)
    check_outputs(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise HydraEdgeError(f"cannot write {path}: {e.strerror}; choose a writable folder") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; the file gets what open() would give
        _fsync(tmp_path)  # on a board's SD card a power cut must not leave a renamed, empty file
        try:
            os.replace(tmp_path, path)
        except IsADirectoryError:  # a folder made there while the file was written
            raise _a_folder(path) from None
        _fsync(path.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path, what: str, hint: str) -> dict[str, Any]:
    """An object from a JSON file that has no record schema (a board app's scenario); a missing,
    unreadable or non-object file is one line. Records go through ``hydra_edge.records``.

    ``what`` names the file for the message ("scenario"); ``hint`` says how to make one.
    """
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise HydraEdgeError(f"no {what} at {path}; {hint}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # json's decode errors are ValueErrors
        raise HydraEdgeError(f"cannot read {what} {path}: {e}") from None
    except RecursionError:
        raise HydraEdgeError(f"{path} nests too deeply to be a hydra-edge {what}") from None
    if not isinstance(d, dict):
        raise HydraEdgeError(f"{path} is not a hydra-edge {what}")
    return d


class NotARegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a folder where a plain file was expected."""


class TooLarge(OSError):
    """A file larger than its reader allows (a 300 MB "sensor", a manifest the size of a disk)."""


def read_limited(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; raises ``OSError``.

    Why not ``Path.read_bytes``: a FIFO put where a sensor or a bundle file belongs blocks a plain
    ``open`` forever (the switcher stops polling, the app hangs), and a huge file costs its whole
    size in memory on every read. The open here never blocks (``O_NONBLOCK``), anything but a
    regular file is refused (``NotARegularFile``; sysfs attributes are regular files), and a file
    longer than ``max_bytes`` is refused (``TooLarge``) after reading at most one byte more.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise NotARegularFile(f"{path} is {kind}")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise TooLarge(f"{path} is larger than {max_bytes} bytes")
    return data


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
