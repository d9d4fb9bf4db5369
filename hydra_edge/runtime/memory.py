"""The device's memory as Linux reports it: what this process holds, and what the kernel can still give.

Standard library only: the calibration runner reads it on a board before it decides whether another
artefact may stay loaded, and reports each artefact's peak. The device's memory is read under ``root``
(a test's tree; ``/`` on a device), this process's own always from ``/proc/self``. Every reader answers
None where the file is missing or unreadable (macOS, a locked-down phone shell), and its caller then
does without.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional


def _kib_fields(path: Path, names: tuple[str, ...]) -> Dict[str, int]:
    """``{name: KiB}`` of the ``name: N kB`` lines of a /proc file that are present and well formed."""
    found: Dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            name, _, rest = line.partition(":")
            words = rest.split()
            if name in names and words and words[0].isdigit():
                found[name] = int(words[0])
    except (OSError, UnicodeDecodeError):
        pass
    return found


SELF = Path("/proc/self")
# What a calibration keeps available: below this share of the device's memory it stops keeping every
# head count loaded between its blocks (calibration/runner.py's ``Resident``)
MEMORY_FLOOR = 0.15


def rss_mb() -> Optional[float]:
    """This process's resident memory now (VmRSS), MiB."""
    kib = _kib_fields(SELF / "status", ("VmRSS",)).get("VmRSS")
    return None if kib is None else kib / 1024.0


def peak_rss_mb() -> Optional[float]:
    """This process's peak resident memory since the last ``reset_peak_rss`` (VmHWM), MiB; where the
    kernel does not say, the peak since the process began (getrusage), an upper bound."""
    kib = _kib_fields(SELF / "status", ("VmHWM",)).get("VmHWM")
    if kib is not None:
        return kib / 1024.0
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    except (ImportError, OSError):
        return None


def reset_peak_rss() -> None:
    """Start a new peak (writing 5 to clear_refs resets VmHWM, Linux 4.0+); where it cannot, the peak
    goes on covering what came before: still an upper bound."""
    try:
        (SELF / "clear_refs").write_text("5")
    except OSError:
        pass


def available_bytes(root: str = "/") -> Optional[int]:
    """MemAvailable: the memory the kernel can give without swapping, in bytes."""
    kib = _kib_fields(Path(root, "proc/meminfo"), ("MemAvailable",)).get("MemAvailable")
    return None if kib is None else kib * 1024


def available_share(root: str = "/") -> Optional[float]:
    """MemAvailable / MemTotal: the share of the device's memory the kernel can give without swapping."""
    fields = _kib_fields(Path(root, "proc/meminfo"), ("MemTotal", "MemAvailable"))
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    return None if not total or available is None else available / total
