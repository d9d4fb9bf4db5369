"""The switcher's promises as invariants, checked after every poll and inference of a replayed trace.

``CheckedReplay`` is ``PythonReplay`` with an independent observer: it reads what the phone reported at
each poll (not what the switcher made of it) and, after each line, asserts

* **fail-safe**: while a signal has failed and has not read well for ``stale_after_s`` (or not since the
  switcher started), no more heads than the table allows in the hottest band (or ``assumed_hot``'s) for a
  failed thermal status or headroom forecast, or in the lowest battery band for a failed battery;
* **the latency cap**: never more heads than the latency loop's cap;
* **the switch rate**: at most ``max_switches_per_minute`` changes of the cap in any 60 s;
* **no exception**, whatever the readings (the replay raises);
* **what the loop learned is on disk after close()** (``assert_saved``), where the clock could date it.

The observer's notion of a good reading is written here from Android's documentation, not imported: a
status 0..6, a forecast from 0 to 10 that is no denormal float, a level 0..100.
"""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional

import numpy as np
import pytest

from support.trace_replay import Line, PythonReplay

from hydra_edge.runtime.closed_loop import correction_path
from hydra_edge.runtime.switcher import Switcher

FLOAT_MIN_NORMAL = np.finfo(np.float32).tiny  # Java's Float.MIN_NORMAL: the headroom is a float


def good(signal: str, value: Any) -> bool:
    """Whether the phone's report of ``signal`` is a reading (see the module docstring)."""
    if signal == "status":
        return isinstance(value, int) and 0 <= value <= 6
    if signal == "level":
        return isinstance(value, int) and 0 <= value <= 100
    if value is None:  # headroom: the HAL's Error: answer
        return False
    h = float(value)
    return 0.0 <= h <= 10.0 and (h == 0.0 or np.float32(h) >= FLOAT_MIN_NORMAL)


class CheckedReplay(PythonReplay):
    """``PythonReplay`` asserting the invariants after every line (see the module docstring)."""

    def __init__(self, trace: Dict[str, Any], bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stale_after_s = float(trace.get("signals", {}).get("stale_after_s", 30.0))
        self.lines = 0
        self.spoiled: Optional[tuple] = None  # (switcher, its loop's revision) when the correction was last spoiled
        super().__init__(trace, bundle, monkeypatch)

    def open(self) -> Switcher:
        sw = super().open()
        self.last_good: Dict[str, float] = {}  # signal -> when it last read well, since this switcher started
        self.failed: Dict[str, bool] = {}  # signal -> whether the last poll's report failed
        self.polled_at = -math.inf
        self.cap = None if sw.loop is None else sw.loop.governor.cap  # the loop's cap as last seen
        self.changes: Deque[float] = deque()  # when the cap changed, in the last minute
        poll = sw.poll

        def observed() -> int:  # every poll, the first one an inference makes included
            self.observe(self.phone.reading, self.clock.now)
            return poll()

        sw.poll = observed  # type: ignore[method-assign]
        return sw

    def observe(self, reading: Dict[str, Any], now: float) -> None:
        self.polled_at = now
        for signal in ("status", "headroom", "level"):
            ok = good(signal, reading.get(signal))
            self.failed[signal] = not ok
            if ok:
                self.last_good[signal] = now

    def stale(self, signal: str) -> bool:
        """Failed at the last poll and not read well within stale_after_s before it."""
        return self.failed.get(signal, False) and \
            self.polled_at - self.last_good.get(signal, -math.inf) >= self.stale_after_s

    def emit(self, op: str, heads: Optional[int], before: int) -> None:
        super().emit(op, heads, before)
        self.lines += 1
        if heads is not None:
            self.check(heads)

    def check(self, heads: int) -> None:
        sw, where = self.sw, f"line {self.lines}"
        table = sw.table
        if sw.fallback is not None:
            assert heads == table.heads[0], f"{where}: {heads} heads on the fallback table"
            return
        names_headroom = table.thermal_headroom and self.trace.get("signals", {}).get("headroom") is not False
        if self.stale("status") or (names_headroom and self.stale("headroom")):
            hot = sw.settings.assumed_hot
            band = table.thermal_band(math.nan if hot is None else hot)
            allowed = max(table.heads[row[band]] for row in table.cells)
            assert heads <= allowed, f"{where}: {heads} heads with the thermal signal failed past " \
                                     f"stale_after_s; the table allows {allowed} when it is unknown"
        if self.stale("level"):
            allowed = max(table.heads[i] for i in table.cells[table.battery_band(math.nan, False)])
            assert heads <= allowed, f"{where}: {heads} heads with the battery failed past stale_after_s; " \
                                     f"the lowest band allows {allowed}"
        if sw.loop is not None:
            governor = sw.loop.governor
            assert heads <= governor.cap, f"{where}: {heads} heads over the latency cap {governor.cap}"
            now = self.clock.now
            if governor.cap != self.cap:
                self.cap = governor.cap
                self.changes.append(now)
            while self.changes and self.changes[0] <= now - 60.0:
                self.changes.popleft()
            limit = governor.settings.max_switches_per_minute
            assert len(self.changes) <= limit, f"{where}: the cap changed {len(self.changes)} times within 60 s, " \
                                               f"at most {limit}"

    def spoil(self, how: str) -> None:
        super().spoil(how)
        self.spoiled = (self.sw, None if self.sw.loop is None else self.sw.loop.governor.revision)

    def assert_saved(self) -> None:
        """After close(): what the loop learned is what lut.correction.json holds. Not asked where nothing
        could be: a clock before 1970 cannot date it, a folder in its place cannot be written, and a file
        the trace spoiled after the loop last learned stays as spoiled."""
        loop = self.sw.loop
        path = correction_path(self.bundle / "lut.json")
        if loop is None or not loop.governor.learned or self.wall.now < 0 or path.is_dir() or \
                self.spoiled == (self.sw, loop.governor.revision):
            return
        assert path.is_file(), f"nothing saved at {path} though the loop learned {sorted(loop.governor.learned)}"
        saved = {e["heads"]: e for e in json.loads(path.read_text())["learned"]}  # as the reader takes them
        learned = {h: {"heads": e.heads, "p90_ms": e.p90_ms, "slowdown": e.slowdown, "samples": e.samples}
                   for h, e in loop.governor.learned.items()}
        assert saved == learned, f"saved {saved}, learned {learned}"


def replay_checked(trace: Dict[str, Any], bundle: Path) -> List[Line]:
    """The trace's lines from Python's switcher, every invariant checked on the way and after close()."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        replay = CheckedReplay(trace, bundle, monkeypatch)
        try:
            replay.run(trace["steps"])
        finally:
            replay.sw.close()
        replay.assert_saved()
    return replay.out
