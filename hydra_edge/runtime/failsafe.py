"""What the switcher selects on when a sensor fails or flaps: never more heads because of it.

Three rules (the C and Kotlin tables' comments ask their callers for the same):

* A signal that stops reading (missing, unreadable, garbage, absurd) keeps its last good reading
  for ``stale_after_s``, so one bad poll does not move the head count; after that it is unknown:
  the hottest thermal band (or the profile's ``assumed_hot``), the lowest battery band. Each
  temperature sensor is held on its own and the hottest counts, so a cooler sensor never stands
  in for a hot one that failed.
* The head count rises only when the table has asked for more for ``raise_after_s`` without a
  break, on readings taken at every poll (a held reading starts the wait over), and then only as
  far as it asked all along; it falls at once. A flapping reading therefore costs heads quickly
  and gives them back rarely, and a sensor that reads only now and then gives none back.
* A signal going bad is logged once, at WARNING, and once more when it has read well again for
  ``raise_after_s``: not once per poll, even while it flaps.

The profile's ``[signals]`` table sets the three numbers (``records.target.Signals`` checks them). Pure logic on the caller's readings and
clock (tests drive it with a fake one); numpy-free and torch-free (the standard library and, for
the ``Signals`` record, msgspec), because boards run it.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, Generic, Mapping, Optional, Tuple, TypeVar

from ..records.target import Signals

T = TypeVar("T")


class Hold(Generic[T]):
    """One signal: its last good reading, since when it has been failing, and what was logged."""

    def __init__(self, name: str, describe: Callable[[T], str], unknown: T, assume: str, settings: Signals,
                 log: logging.Logger) -> None:
        self.name, self.describe, self.unknown, self.assume = name, describe, unknown, assume
        self.settings, self.log = settings, log
        self.last: Optional[T] = None
        self.last_at = -math.inf  # when ``last`` was read
        self.bad_since: Optional[float] = None  # the failure being reported; None while healthy
        self.good_since: Optional[float] = None  # the current run of good reads inside a failure
        self.failures = 0  # bad reads since ``bad_since``
        self.held = False  # the last update returned an older reading, not this poll's

    def update(self, value: Optional[T], why: Optional[str], now: float) -> Tuple[T, Optional[str]]:
        """The reading to select on (``value``, the held one, or ``unknown``) and, when it is not
        this poll's own, a note for the switch event ("thermal unknown since 31 s")."""
        if value is not None:
            self.last, self.last_at, self.held = value, now, False
            self._recovering(now)
            return value, None
        self.good_since = None
        self.failures += 1
        last = self.last if now - self.last_at < self.settings.stale_after_s else None
        self.held = last is not None
        if self.bad_since is None:
            self.bad_since, self.failures = now, 1
            if last is not None:
                self.log.warning("%s unreadable (%s) — holding the last reading %s for up to %g s", self.name, why,
                                 self.describe(last), self.settings.stale_after_s)
            else:
                self.log.warning("%s unreadable (%s) — no recent reading; assuming %s", self.name, why, self.assume)
        if last is not None:
            return last, f"{self.name} unreadable, holding {self.describe(last)} from {now - self.last_at:.0f} s ago"
        since = now - (self.last_at if self.last is not None else self.bad_since)
        return self.unknown, f"{self.name} unknown since {since:.0f} s"

    def _recovering(self, now: float) -> None:
        """End a failure once the signal has read well for ``raise_after_s`` (a flapping one never does)."""
        if self.bad_since is None:
            return
        if self.good_since is None:
            self.good_since = now
        if now - self.good_since >= self.settings.raise_after_s:
            self.log.warning("%s readable again (%s) after %.0f s with %d failed reads", self.name,
                             self.describe(self.last), now - self.bad_since, self.failures)
            self.bad_since = self.good_since = None


class Hottest:
    """Several temperature sensors, each with its own ``Hold``; the reading is the hottest of them.

    A sensor that fails keeps its last good reading for ``stale_after_s`` and then counts as
    ``unknown``, exactly as a lone sensor does: the others reading cool never stand in for it, and
    NaN (unknown) is hotter than any reading. ``named``: every sensor reported counts from its first
    report, a failing one too (the profile named it). Otherwise (a board whose every thermal zone is
    read) a sensor counts once it has given a reading: a zone that never reads is a disabled one,
    while one that read and stopped has failed.
    """

    def __init__(self, describe: Callable[[float], str], unknown: float, assume: str, settings: Signals,
                 log: logging.Logger, named: bool) -> None:
        self.describe, self.unknown, self.assume, self.settings, self.log = describe, unknown, assume, settings, log
        self.named = named
        self.holds: Dict[str, Hold[float]] = {}

    @property
    def held(self) -> bool:
        """Whether the last update held some sensor's older reading."""
        return any(hold.held for hold in self.holds.values())

    def update(self, readings: Mapping[str, float], errors: Mapping[str, str], missing: str,
               now: float) -> Tuple[Optional[float], Optional[str]]:
        """The hottest of every sensor that counts (this poll's, held or ``unknown``) and, for those
        that did not read, the notes for the switch event; (None, None) while no sensor counts.

        ``errors`` says why a sensor gave no reading; ``missing`` why one that counts was not reported.
        """
        for sensor in [*readings, *(errors if self.named else ())]:
            if sensor not in self.holds:
                self.holds[sensor] = Hold(f"thermal sensor {sensor}", self.describe, self.unknown, self.assume,
                                          self.settings, self.log)
        if not self.holds:
            return None, None
        results = [hold.update(readings.get(sensor), errors.get(sensor, missing), now)
                   for sensor, hold in self.holds.items()]
        values = [value for value, _ in results]
        hottest = math.nan if any(math.isnan(value) for value in values) else max(values)
        return hottest, ", ".join(note for _, note in results if note) or None


class RaiseGate:
    """Lets the head count rise only after the table has asked for more for ``raise_after_s``.

    Works on candidate ranks (0: fastest, fewest heads). While it waits it keeps the least the
    table asked for, so a reading that wavered between two better cells gets the lesser one. A
    poll on a held reading (``fresh`` false) starts the wait over: the reading did not persist,
    it was assumed to.
    """

    def __init__(self, raise_after_s: float) -> None:
        self.raise_after_s = raise_after_s
        self.since: Optional[float] = None  # when the table began asking for more; None: it is not
        self.floor = 0

    def __call__(self, current: int, proposed: int, now: float, fresh: bool = True) -> int:
        """The rank to run: ``proposed`` when it is not higher, else ``current`` until it has persisted."""
        if proposed <= current or not fresh:
            self.since = None
            return min(proposed, current)
        if self.since is None:
            self.since, self.floor = now, proposed
        self.floor = min(self.floor, proposed)
        if now - self.since < self.raise_after_s:
            return current
        self.since = None
        return self.floor
