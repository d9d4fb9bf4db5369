"""hydra_edge.runtime.memory: the device's available share from /proc/meminfo, and None where it says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydra_edge.runtime.memory import available_bytes, available_share, peak_rss_mb, rss_mb


@pytest.mark.parametrize("text, share", [
    ("MemTotal:        4000000 kB\nMemFree:  1 kB\nMemAvailable:    1000000 kB\n", 0.25),
    ("MemAvailable:    1000000 kB\nMemTotal:        2000000 kB\n", 0.5),
    ("MemTotal:        4000000 kB\nMemFree:   1000 kB\n", None),  # Linux < 3.14: no MemAvailable
    ("MemTotal:        0 kB\nMemAvailable:    0 kB\n", None),
    ("MemTotal:        -5 kB\nMemAvailable:    1 kB\n", None),
    ("MemTotal:        4e9 kB\nMemAvailable:    1 kB\n", None),
    ("MemTotal:\nMemAvailable:    1 kB\n", None),
    ("garbage", None),
    ("", None),
])
def test_the_available_share_is_read_or_none(tmp_path: Path, text: str, share: float | None) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(text)
    assert available_share(str(tmp_path)) == share


@pytest.mark.parametrize("text, available", [("MemTotal: 4 kB\nMemAvailable:    1000 kB\n", 1_024_000),
                                             ("MemTotal:        4000000 kB\n", None), ("MemAvailable: x kB\n", None)])
def test_the_available_bytes_are_memavailable_in_bytes(tmp_path: Path, text: str, available: int | None) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(text)
    assert available_bytes(str(tmp_path)) == available


def test_no_meminfo_or_bytes_that_are_not_text_read_as_none(tmp_path: Path) -> None:
    assert available_share(str(tmp_path)) is None and available_bytes(str(tmp_path)) is None
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_bytes(b"MemTotal: \xff\xfe kB\n")
    assert available_share(str(tmp_path)) is None


def test_this_process_holds_some_memory_and_its_peak_at_least_that() -> None:
    now, peak = rss_mb(), peak_rss_mb()
    assert now is not None and peak is not None and 0 < now <= peak
