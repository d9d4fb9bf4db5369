"""The switcher's world in a test: a fake sysfs tree for its board, a clock, and its policy and input.

``Board`` writes the files the switcher reads (a thermal zone, a battery, a second sensor) under a
temporary root, and ``write`` makes one of them misbehave as sysfs attributes do; ``Clock`` is a
time the test moves by hand. ``POLICY`` picks 12, 9, 6, 3 heads as the board heats up.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

# bands <60, 60-70, 70-80, >=80 °C pick 12, 9, 6, 3 heads on mains (latency 10/20/30/40 ms, budget 41 ms)
POLICY = "[thermal]\nderating = [1.0, 1.3, 1.9, 3.5]\n"
IMAGE = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)


class Board:
    """A fake sysfs tree: one thermal zone and the battery the profile names (full: the same bands as mains)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        zone = root / "sys/class/thermal/thermal_zone0"
        zone.mkdir(parents=True)
        (zone / "type").write_text("cpu-thermal\n")
        self.temp(40)
        self.battery(100, "Full")

    @property
    def temp_file(self) -> Path:
        return self.root / "sys/class/thermal/thermal_zone0/temp"

    @property
    def capacity_file(self) -> Path:
        return self.root / "sys/class/power_supply/BAT0/capacity"

    def temp(self, c: float) -> None:
        write(self.temp_file, f"{int(c * 1000)}\n")

    @property
    def gpu_file(self) -> Path:
        return self.root / "sys/class/thermal/thermal_zone1/temp"

    def gpu(self, c: float) -> None:
        """A second sensor: thermal_zone1, of type gpu-thermal."""
        self.gpu_file.parent.mkdir(exist_ok=True)
        write(self.gpu_file.with_name("type"), "gpu-thermal\n")
        write(self.gpu_file, f"{int(c * 1000)}\n")

    def battery(self, pct: int, status: str = "Discharging") -> None:
        bat = self.root / "sys/class/power_supply/BAT0"
        bat.mkdir(parents=True, exist_ok=True)
        for name, value in (("type", "Battery"), ("capacity", pct), ("status", status)):
            write(bat / name, f"{value}\n")

    def no_battery(self) -> None:
        shutil.rmtree(self.root / "sys/class/power_supply")


def write(path: Path, content: str) -> None:
    """Replace ``path`` (a file, a directory or a link) with ``content``: a sensor that misbehaves as
    sysfs attributes really do. ``directory`` and ``dangling`` make it unreadable; other text is its value."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        path.rmdir()
    if content == "directory":
        path.mkdir()  # reading it: NotARegularFile (a folder)
    elif content == "dangling":
        path.symlink_to(path.with_name("gone"))  # reading it: FileNotFoundError
    else:
        path.write_text(content)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
