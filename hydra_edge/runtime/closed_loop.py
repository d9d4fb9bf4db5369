"""The switcher's closed loop: the latency governor fed by lut.json's budget, and the correction it
learns saved beside lut.json so a restarted app starts from it.

``LatencyLoop`` takes the budget, each battery band's budget scale and the file's sha256 from the
table the switcher read (lut.json is read once), builds a ``LatencyGovernor`` on the table's
calibrated latencies, and loads ``lut.correction.json`` (``correction_path``) when it is usable:

* learned against this bundle and this table (the manifest's and lut.json's sha256),
* dated no later than now, and no older than ``LoopSettings.expire_s``,
* a valid record naming only head counts of the table.

Anything else is ignored with one warning line (an expired one with an info line): inference goes
on with the table's head counts, never with more. A correction is written (atomically) each time
the governor learns something, by the caller's choice of thread (the switcher: its background
loader, so an inference never waits for an SD card); a write that fails is one warning, and
inference goes on. Wall-clock time (``wall_clock``) dates the file, so it expires across reboots; a
clock before 1970 or no number (a phone or board whose clock was never set) dates nothing: it is a
failed read of the clock, one warning, and while it lasts nothing is restored nor written.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Tuple

from .. import __version__
from ..atomic import write_bytes
from ..errors import HydraEdgeError
from ..records import correction as record
from ..records.correction import CorrectionError, LearnedLatency
from ..records.lut import LutError
from .latency_governor import LatencyGovernor, LoopSettings
from .lut import Table


def correction_path(lut_path: Path) -> Path:
    """Where the correction learned against ``lut_path`` is kept: ``lut.json`` -> ``lut.correction.json``."""
    return lut_path.with_name(f"{lut_path.stem}.correction.json")


class LatencyLoop:
    """The governor with lut.json's budget and the saved correction (see the module docstring).

    ``table`` is the switcher's, read from ``lut_path``; a lut.json that changed since (its
    candidates differ) or a candidate calibrated at 0 ms (no slow-down can be measured against
    it) is a ``LutError``: the switcher then runs the smallest head count.
    """

    def __init__(self, lut_path: Path, table: Table, settings: LoopSettings, wall_clock: Callable[[], float],
                 log: logging.Logger) -> None:
        if not table.sha256:
            raise LutError(f"{lut_path}: the switcher runs no table read from it; re-run hydra-edge lut")
        for i, c in enumerate(table.candidates):
            if c.latency_ms <= 0:
                raise LutError(f"{lut_path}: $.candidates[{i}].latency_ms: {c.heads} heads calibrated at "
                               f"{c.latency_ms:g} ms, nothing to scale a slow-down by; re-run hydra-edge calibrate")
        self.path = correction_path(lut_path)
        self.settings, self.wall_clock, self.log = settings, wall_clock, log
        self.table = table
        self.budget_ms = settings.budget_ms if settings.budget_ms is not None else table.budget_ms
        self.manifest_sha256, self.lut_sha256 = table.manifest_sha256, table.sha256
        self.budget_now = self.budget_ms
        self._saved_revision = 0
        self._write_failed = False
        self._clock_failed = False
        calibrated = {c.heads: c.latency_ms for c in table.candidates}
        self.governor = LatencyGovernor(calibrated, settings, log, self._load(calibrated))

    def budget(self, battery_pct: float, charging: bool) -> float:
        """The budget now: ``budget_ms`` scaled for the battery band, as the table scales it."""
        self.budget_now = self.budget_ms * self.table.budget_scale[self.table.battery_band(battery_pct, charging)]
        return self.budget_now

    # -- the saved correction -------------------------------------------------------------------

    def _load(self, calibrated: Mapping[int, float]) -> Optional[Tuple[Dict[int, LearnedLatency], float]]:
        """The saved correction and its age in seconds, or None when there is none to use (and why, once)."""
        if not (self.path.exists() or self.path.is_symlink()):
            return None
        try:
            doc = record.read(self.path)
        except CorrectionError as e:
            self.log.warning("%s", e)
            return None
        now = self._now()
        if now is None:
            return None
        age = now - doc.saved_at
        why = None
        others = [f"{what} ({name} sha256 {theirs[:12]}, this {mine_is} {ours[:12]})"
                  for what, name, mine_is, theirs, ours in (
                      ("another bundle", "manifest.json", "bundle's", doc.manifest_sha256, self.manifest_sha256),
                      ("another table", "lut.json", "table's", doc.lut_sha256, self.lut_sha256))
                  if theirs != ours]  # only what differs: the same sha256 twice would send one looking in vain
        if others:
            why = f"learned against {' and '.join(others)}"
        elif age < 0:
            why = f"dated {-age:.0f} s in the future (was the clock set back?)"
        elif any(entry.heads not in calibrated for entry in doc.learned):
            why = f"names head counts this table lacks ({sorted(e.heads for e in doc.learned)})"
        if why is not None:
            self.log.warning("%s: %s; %s", self.path, why, record.HINT)
            return None
        if age > self.settings.expire_s:
            self.log.info("%s: saved %.0f s ago, past expire_s (%g s); not used", self.path, age,
                          self.settings.expire_s)
            return None
        return {entry.heads: entry for entry in doc.learned}, age

    def snapshot(self) -> Optional[bytes]:
        """The correction's bytes when the governor has learned something since the last snapshot, else None.

        Taken under the caller's lock, so the write that follows (``save``) needs none.
        """
        governor = self.governor
        if governor.revision == self._saved_revision:
            return None
        now = self._now()
        if now is None:  # kept unsaved: the next snapshot after the clock is set takes it
            return None
        self._saved_revision = governor.revision
        doc = record.CorrectionDocument(
            created_by=f"hydra-edge {__version__}", saved_at=now, manifest_sha256=self.manifest_sha256,
            lut_sha256=self.lut_sha256, budget_ms=self.budget_now,
            learned=[governor.learned[h] for h in sorted(governor.learned)])
        return record.encode(doc, str(self.path))

    def _now(self) -> Optional[float]:
        """The wall clock in seconds since the epoch, or None (one warning, the first time) when it reads before
        1970 or no number: a correction dated by it could not be aged, nor one saved before it."""
        now = self.wall_clock()
        if math.isfinite(now) and now >= 0:
            return now
        if not self._clock_failed:
            self.log.warning("the wall clock reads %r, before 1970 or no time at all: the latency correction %s is "
                             "neither restored nor saved until the clock is set", now, self.path)
        self._clock_failed = True
        return None

    def save(self, data: bytes) -> None:
        """Write a snapshot atomically; a failure is one warning (the first only) and inference goes on."""
        try:
            write_bytes(self.path, data)
        except (HydraEdgeError, OSError) as e:
            if not self._write_failed:
                self.log.warning("cannot save the latency correction to %s (%s); it will be learned again "
                                 "after a restart", self.path, e)
            self._write_failed = True
