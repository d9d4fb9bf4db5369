"""Text helpers shared by every reader: one way to read a file, pull pairs, and read a number.

Device files and tool output are messy (missing files, ``nan``, trailing NULs, units glued to
numbers), so each helper answers ``None`` rather than raising: a reader that cannot tell gives
a ``None`` field, and the switcher keeps running.
"""

import math
import re
from pathlib import Path
from typing import Dict, Optional, Pattern, Union

# A signed decimal with optional exponent; units that follow (``mW``, ``'C``, ``MB``) are left out.
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

# ``key: value`` on its own line: dumpsys battery/thermalservice, /proc/cpuinfo.
COLON_LINES = re.compile(r"^[ \t]*([^:\n]+?)[ \t]*:[ \t]*(.*?)[ \t]*$", re.MULTILINE)
# ``key=value`` tokens inside a line: vcgencmd, benchmark_model's ``count=.. avg=..``.
EQUALS_TOKENS = re.compile(r"(\w+)=([-+.\w]+)")


def read_text(path: Union[str, Path]) -> Optional[str]:
    """The stripped text of a file, or None when it is missing or unreadable.

    sysfs attributes can exist yet fail on read (a disabled zone answers EINVAL), and
    device-tree strings end in NUL, so both are handled here once.
    """
    try:
        return Path(path).read_text(errors="replace").strip().strip("\x00").strip()
    except OSError:
        return None


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
