"""``DeviceInfo``: what the device is, stored beside every measurement taken on it."""

import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from ._text import COLON_LINES, pairs, read_text

# Where Linux names the board: device tree on ARM boards (Pi, Jetson), DMI on PCs.
_MODEL_FILES = ("proc/device-tree/model", "sys/firmware/devicetree/base/model",
                "sys/class/dmi/id/product_name")
# ARM's own core part numbers (implementer 0x41); ARM /proc/cpuinfo names no "model name".
_ARM_PARTS = {"0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
              "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76", "0xd41": "Cortex-A78",
              "0xd42": "Cortex-A78AE", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710"}
_ARM_CPU_PART = re.compile(r"^CPU part\s*:\s*(0x[0-9a-f]+)\s*$", re.MULTILINE | re.IGNORECASE)
_OS_RELEASE = re.compile(r'^(\w+)="?(.*?)"?\s*$', re.MULTILINE)
# /proc/cpuinfo grows with the cores (about 1.5 KB each on x86), unlike a sysfs attribute's one page.
CPUINFO_BYTES = 1 << 20


@dataclass(frozen=True)
class DeviceInfo:
    """Board or phone identity. ``arch`` is ``uname -m`` on Linux, the primary ABI on Android."""

    model: Optional[str]
    cpu_model: Optional[str]
    arch: Optional[str]
    cores: Optional[int]
    os: Optional[str]
    kernel: Optional[str]
    python: Optional[str]

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def read_device_info(root: str = "/") -> DeviceInfo:
    """Describe the Linux machine this runs on; files are read under ``root``.

    ``arch``, ``cores`` and ``python`` come from the running interpreter, not from ``root``.
    """
    cpuinfo = read_text(Path(root, "proc/cpuinfo"), CPUINFO_BYTES)
    os_release = pairs(_OS_RELEASE, read_text(Path(root, "etc/os-release")))
    return DeviceInfo(
        model=next(filter(None, (read_text(Path(root, name)) for name in _MODEL_FILES)), None),
        cpu_model=_cpu_model(cpuinfo),
        arch=platform.machine() or None,
        cores=os.cpu_count(),
        os=os_release.get("PRETTY_NAME") or os_release.get("NAME"),
        kernel=read_text(Path(root, "proc/sys/kernel/osrelease")),
        python=platform.python_version(),
    )


def _cpu_model(cpuinfo: Optional[str]) -> Optional[str]:
    """x86's ``model name``; on ARM the distinct core types, big.LITTLE as ``A55 + A76``."""
    name = pairs(COLON_LINES, cpuinfo).get("model name")
    if name:
        return name
    parts = dict.fromkeys(part.lower() for part in _ARM_CPU_PART.findall(cpuinfo or ""))
    names = [_ARM_PARTS.get(part, f"CPU part {part}") for part in parts]
    return " + ".join(names) or pairs(COLON_LINES, cpuinfo).get("Hardware")


def android_device_info(getprop: Mapping[str, str]) -> DeviceInfo:
    """Describe an Android phone from its ``getprop`` values (see ``parse_getprop``).

    Made on the host from text fetched over adb, so nothing is taken from the local machine.
    """
    release = getprop.get("ro.build.version.release")
    return DeviceInfo(
        model=getprop.get("ro.product.model"),
        cpu_model=getprop.get("ro.soc.model") or getprop.get("ro.board.platform"),
        arch=getprop.get("ro.product.cpu.abi"),
        cores=None,
        os=f"Android {release}" if release else None,
        kernel=None,
        python=None,
    )
