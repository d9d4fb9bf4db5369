"""One writer at a time for a bundle or a calibration record, and a note of who that writer is.

Two ``convert`` runs into one folder, or two calibrations of one device into one file, would
each rewrite the manifest or record from what they read at the start, and the later write would
drop what the other added. An OS file lock (released by the kernel if its holder dies) beside
what it protects makes the second run wait; a small note beside the lock says who holds it
(pid, host, command, since when), so the waiting run can tell the user what it waits for.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from .atomic import read_limited, write_json
from .errors import HydraEdgeError


NOTE_BYTES = 64 * 1024  # an owner note is a few hundred bytes; anyone can write one, even a FIFO


class LockedError(HydraEdgeError):
    """Another process holds the lock and the caller asked not to wait."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _owner_file(lock_file: Path) -> Path:
    return lock_file.with_name(lock_file.name + ".owner")


def holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, in words, from the note its holder wrote."""
    try:
        note = json.loads(read_limited(_owner_file(lock_file), NOTE_BYTES))
        return f"pid {note['pid']} on {note['host']} (`{note['command']}`, since {_when(note['since'])})"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "another process (it has not said which yet)"


def _when(since: object) -> str:
    """A note's ``since`` as local time; a note anyone can write may hold a time no clock can show."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


@contextmanager
def exclusive(lock_file: Path, what: str, wait: bool = True, say: Callable[[str], None] = _say) -> Iterator[None]:
    """Hold ``lock_file`` for the block; ``what`` names the protected thing in messages.

    A held lock means waiting (saying so once, naming the holder), or with ``wait=False`` a
    ``LockedError`` naming the holder. The lock's folder must exist; one removed while this waits
    (by ``remove_unused``'s caller) is made again, as the caller made it before.
    """
    lock = FileLock(lock_file)
    try:
        _acquire(lock, lock_file, what, timeout=0)
    except Timeout:
        if not wait:
            raise LockedError(f"{what} is in use by {holder(lock_file)}; wait for it to finish "
                              "(or run without --no-wait to wait for it)") from None
        say(f"waiting for {what}: in use by {holder(lock_file)}")
        _acquire(lock, lock_file, what)
    try:
        write_json(_owner_file(lock_file), {"pid": os.getpid(), "host": platform.node() or "localhost",
                                            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200],
                                            "since": time.time()})
        yield
    finally:
        _owner_file(lock_file).unlink(missing_ok=True)
        lock.release()


def _acquire(lock: FileLock, lock_file: Path, what: str, timeout: float = -1) -> None:
    while True:
        try:
            lock.acquire(timeout=timeout)
            return
        except FileNotFoundError:  # the folder is gone: filelock creates the file, not its folder
            try:
                lock_file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise HydraEdgeError(f"cannot make the folder of {what} again ({lock_file.parent}): {e.strerror}; "
                                     "choose a writable folder") from None


def remove_unused(lock_file: Path) -> bool:
    """Remove ``lock_file`` unless another process holds it; whether it was removed.

    Taken without waiting and removed while held: a run that waits for it at that moment and then locks
    the removed file sees it gone (filelock checks its link count) and locks the path anew, which
    ``exclusive`` makes again with its folder, so no two runs ever hold two files of one path.
    """
    lock = FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except (Timeout, FileNotFoundError):
        return False
    try:
        lock_file.unlink(missing_ok=True)
    finally:
        lock.release()
    return True
