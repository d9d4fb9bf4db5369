"""Text helpers shared by every reader: one way to read a file, pull pairs, and read a number.

Device files and tool output are messy (missing files, ``nan``, trailing NULs, units glued to
numbers), so each helper answers ``None`` rather than raising: a reader that cannot tell gives
a ``None`` field, and the switcher keeps running. ``read_number`` also says why not, so the
switcher can tell a sensor that is absent from one that is there but unreadable or absurd.
"""

import math
import re
from pathlib import Path
from typing import Dict, Optional, Pattern, Tuple, Union

from ...atomic import read_limited

# A signed decimal with optional exponent; units that follow (``mW``, ``'C``, ``MB``) are left out.
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

# What the kernel writes for a sensor attribute (``%d``): ASCII digits, a minus sign before a non-zero
# value, no leading zero. Python's float() and int() also take 45_000, full-width digits, 4.5e4, -0 and
# +45000; a file that holds one of those is garbled (or written by something else), so it is a failed
# read, which the fail-safe rules hold and then treat as the worst band, never a cool, full board.
KERNEL_INTEGER = re.compile(r"0|-?[1-9][0-9]*", re.ASCII)

# ``key: value`` on its own line: dumpsys battery/thermalservice, /proc/cpuinfo.
COLON_LINES = re.compile(r"^[ \t]*([^:\n]+?)[ \t]*:[ \t]*(.*?)[ \t]*$", re.MULTILINE)
# ``key=value`` tokens inside a line: vcgencmd, benchmark_model's ``count=.. avg=..``.
EQUALS_TOKENS = re.compile(r"(\w+)=([-+.\w]+)")


# The most a sysfs attribute holds (one page): a longer "sensor" is not one, and reading all of a
# 300 MB file at every poll costs the board close to a second and twice its size in memory.
PAGE = 4096


def read_file(path: Union[str, Path], max_bytes: int = PAGE) -> str:
    """The stripped text of a regular file of at most ``max_bytes``; raises ``OSError``. The one
    place that opens device files.

    A FIFO, a device or a socket where a sensor belongs is refused without blocking (a plain open
    of a FIFO waits for a writer forever), and so is a file longer than ``max_bytes``
    (``hydra_edge.atomic.read_limited``). Device-tree strings end in NUL, so that is stripped here once.
    """
    return read_limited(path, max_bytes).decode(errors="replace").strip().strip("\x00").strip()


def read_text(path: Union[str, Path], max_bytes: int = PAGE) -> Optional[str]:
    """The stripped text of a file, or None when it is missing, unreadable, not a regular file or
    longer than ``max_bytes``.

    sysfs attributes can exist yet fail on read (a disabled zone answers EINVAL).
    """
    try:
        return read_file(path, max_bytes)
    except OSError:
        return None


def range_error(value: float, valid: Tuple[float, float], unit: str) -> Optional[str]:
    """Why ``value`` is not a plausible reading (outside ``valid``), or None when it is."""
    low, high = valid
    return None if low <= value <= high else f"{value:g} {unit} is outside {low:g}..{high:g} {unit}"


def read_number(path: Union[str, Path], scale: float, valid: Tuple[float, float],
                unit: str) -> Tuple[Optional[float], Optional[str]]:
    """A sysfs attribute holding one number, times ``scale``: (value, None) or (None, why not).

    Why not: the file is missing or will not read (EACCES, EIO, a directory), is empty, is not
    exactly one ``KERNEL_INTEGER``, or gives a value outside ``valid`` (1e9 m°C is a broken driver,
    not a hot board).
    """
    try:
        text = read_file(path)
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    if not KERNEL_INTEGER.fullmatch(text):
        return None, f"{path} reads {text[:40]!r}, not a number (not a plain integer, as the kernel writes)"
    value = int(text) * scale
    error = range_error(value, valid, unit)
    return (None, f"{path}: {error}") if error else (value, None)


def pairs(pattern: Pattern[str], text: Optional[str]) -> Dict[str, str]:
    """Every (group 1 -> group 2) match of ``pattern`` in ``text``; the first occurrence wins.

    First wins because the tools repeat keys in later, less relevant places (per-core blocks of
    /proc/cpuinfo).
    """
    found: Dict[str, str] = {}
    for match in pattern.finditer(text or ""):
        found.setdefault(match.group(1).strip(), match.group(2).strip())
    return found


def number(text: Optional[str], scale: float = 1.0) -> Optional[float]:
    """The first number in ``text`` times ``scale``; None if there is none or it is not finite."""
    match = re.search(NUMBER, text or "")
    if match is None:
        return None
    value = float(match.group(0)) * scale
    return value if math.isfinite(value) else None


def integer(text: Optional[str]) -> Optional[int]:
    """``text`` as an int (decimal, or hex with a 0x prefix), or None."""
    text = (text or "").strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None
