"""The lookup table on the device: read ``lut.json`` and pick a head count, with hysteresis.

This is the one Python implementation of the selection logic; ``hydra_edge.lut.emit_c`` and
``emit_kotlin`` write the same few lines in C and Kotlin, and a test checks that all three agree.
Numpy-free and torch-free: the standard library and msgspec (through ``hydra_edge.records``),
Python 3.9+, because boards run it.

The decision is a pure function of five numbers, so it is the same in every language:

``select(battery_pct, charging, thermal, prev_heads, since_switch_s) -> heads``

* ``battery_pct``: 0-100, -1 when there is no battery (a board on mains whose profile names no
  battery), or NaN when the battery is unknown (named but missing, unreadable or garbage). Unknown
  is the lowest battery band, whatever ``charging`` says; charging or no battery is band 0;
  otherwise band ``i + 1`` is the first ``i`` with ``pct >= battery_min_pct[i]``.
* ``thermal``: in the table's thermal unit: °C for ``source == "temperature"`` (Linux, Jetson,
  Raspberry Pi, where a throttled Pi reports at least ``throttled_c``), the Android thermal status
  (0 NONE .. 6 SHUTDOWN) for ``source == "android"``; NaN (unknown) is the hottest band.
  Otherwise the thermal band is the number of ``thermal_edges`` that ``thermal`` reaches (``>=``).
* Unknown means unknown now: a caller holds a sensor's last good reading for the profile's
  ``stale_after_s`` before passing NaN, and lets the head count rise only on a reading that has
  persisted ``raise_after_s`` (``hydra_edge.runtime.failsafe``; the C and Kotlin comments say the same),
  so a failed sensor never buys more heads.
* The cell ``(battery band, thermal band)`` names a candidate; candidates are ordered fastest
  (least accurate) first.
* Hysteresis, on the previous head count alone: a worse-or-equal cell is taken at once (the budget
  must hold now); a better cell only after ``min_dwell_s`` since the last switch, and only as far
  as the cell still allows when the temperature is ``thermal_margin`` higher and the battery
  ``battery_margin_pct`` lower. A reading oscillating inside the margins therefore never flaps.
  A ``prev_heads`` that is not a candidate (0 at start-up) takes the cell as it is.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import msgspec

from ..atomic import sha256_file
from ..records import codec
from ..records import lut as record
from ..records.lut import LutError
from ..records.manifest import MANIFEST, read_manifest
from .signals import configured


# A Pareto-optimal subnetwork of this device, as lut.json records it and the switcher loads it.
Candidate = record.LutCandidate


@dataclass(frozen=True)
class Table:
    """What the selection needs from ``lut.json``; ``cells[b][t]`` indexes ``candidates``."""

    candidates: Tuple[Candidate, ...]  # fastest first
    cells: Tuple[Tuple[int, ...], ...]  # (battery bands, thermal bands)
    thermal_source: str
    thermal_headroom: bool  # the target names Android's thermal headroom (lut.json's thermal.headroom)
    thermal_edges: Tuple[float, ...]  # ascending
    thermal_margin: float
    throttled_c: Optional[float]  # temperature source: a throttled Raspberry Pi counts as this hot
    battery_min_pct: Tuple[float, ...]  # descending, one per discharging band
    battery_margin_pct: float
    min_dwell_s: float
    manifest_sha256: str
    # The latency budget, for an app that holds its timings to it (``hydra_edge.runtime.latency_governor``);
    # a table built without one (the switcher's one-cell fallback) has none: NaN, and no scales.
    budget_ms: float = math.nan
    budget_scale: Tuple[float, ...] = ()  # per battery band, as ``battery_band`` counts them
    sha256: str = ""  # of the bytes ``read_table`` read, so nothing reads the file twice; "" when not read from one

    @property
    def heads(self) -> Tuple[int, ...]:
        return tuple(c.heads for c in self.candidates)

    def candidate(self, heads: int) -> Candidate:
        return next(c for c in self.candidates if c.heads == heads)

    def thermal_band(self, thermal: float) -> int:
        if math.isnan(thermal):  # unknown: assume the worst
            return len(self.thermal_edges)
        return sum(1 for edge in self.thermal_edges if thermal >= edge)

    def battery_band(self, battery_pct: float, charging: bool) -> int:
        if math.isnan(battery_pct):  # unknown, unlike -1 (no battery): assume the worst
            return len(self.battery_min_pct)
        if charging or battery_pct < 0:
            return 0
        for i, min_pct in enumerate(self.battery_min_pct):
            if battery_pct >= min_pct:
                return i + 1
        return len(self.battery_min_pct)

    def budget(self, battery_pct: float, charging: bool) -> float:
        """The latency budget now: ``budget_ms`` scaled for the battery band (C and Kotlin mirror this)."""
        return self.budget_ms * self.budget_scale[self.battery_band(battery_pct, charging)]

    def cell(self, battery_pct: float, charging: bool, thermal: float) -> int:
        """The candidate index for a reading, without hysteresis."""
        return self.cells[self.battery_band(battery_pct, charging)][self.thermal_band(thermal)]

    def select(self, battery_pct: float, charging: bool, thermal: float, prev_heads: int,
               since_switch_s: float) -> int:
        """The head count to run now (see the module docstring; C and Kotlin mirror this)."""
        raw = self.cell(battery_pct, charging, thermal)
        prev = self.heads.index(prev_heads) if prev_heads in self.heads else -1
        if prev < 0 or raw <= prev:
            return self.candidates[raw].heads
        if since_switch_s < self.min_dwell_s:
            return self.candidates[prev].heads
        cautious_pct = max(battery_pct - self.battery_margin_pct, 0.0) if battery_pct >= 0 else battery_pct
        safe = self.cell(cautious_pct, charging, thermal + self.thermal_margin)
        return self.candidates[max(prev, min(raw, safe))].heads

    def thermal_input(self, max_temp_c: Optional[float], throttled: bool = False,
                      android_status: Optional[int] = None) -> float:
        """A device reading in the table's thermal unit (NaN when unknown)."""
        if self.thermal_source == "android":
            return math.nan if android_status is None else float(android_status)
        temp = math.nan if max_temp_c is None else float(max_temp_c)
        if throttled and self.throttled_c is not None:
            temp = self.throttled_c if math.isnan(temp) else max(temp, self.throttled_c)
        return temp


# A table's thermal source, as the device's reading it is in: what a person reads in a message.
THERMAL_UNITS = {"android": "the Android thermal status (0 NONE .. 6 SHUTDOWN)", "temperature": "°C"}


def target_thermal_source(target: Mapping[str, Any]) -> Optional[str]:
    """The thermal source a bundle's target profile (the manifest's ``target``) reads: "android" when its
    ``[signals]`` read ``dumpsys thermalservice``, "temperature" when they read thermal zones or vcgencmd,
    None when they read no thermal signal (the device then always passes NaN: the hottest band)."""
    signals = configured(target.get("signals") or {})
    if signals.get("thermal") == "dumpsys":
        return "android"
    return "temperature" if signals.get("thermal") == "sysfs" or signals.get("vcgencmd") else None


def thermal_source_problem(source: str, reads: Optional[str], device: str) -> Optional[str]:
    """Why a table on thermal ``source`` cannot run on a ``device`` that reads ``reads`` (None: it reads no
    thermal signal, so any table fits), or None. A mismatch is no safe default: the device's number taken
    in the wrong unit (SHUTDOWN, 6, read as 6 °C) picks the coolest band."""
    if reads is None or reads == source:
        return None
    return (f"{source!r} bands the table in {THERMAL_UNITS[source]}, but {device} reads {THERMAL_UNITS[reads]}; "
            f"set the policy's [thermal] source = {reads!r} (or \"auto\") and re-run hydra-edge lut")


def _table(doc: record.LutDocument, sha256: str = "") -> Table:
    """The selection's view of a checked ``lut.json`` (``hydra_edge.records.lut`` checked every field)."""
    return Table(
        candidates=tuple(doc.candidates),
        cells=tuple(tuple(row) for row in doc.selection.cells),
        thermal_source=doc.thermal.source,
        thermal_headroom=doc.thermal.headroom,
        thermal_edges=tuple(doc.thermal.edges),
        thermal_margin=doc.thermal.margin,
        throttled_c=doc.thermal.throttled_c,
        battery_min_pct=tuple(doc.battery.min_pct),
        battery_margin_pct=doc.battery.margin_pct,
        min_dwell_s=doc.selection.min_dwell_s,
        manifest_sha256=doc.bundle.manifest_sha256,
        budget_ms=doc.budget_ms,
        budget_scale=tuple(doc.battery.budget_scale),
        sha256=sha256,
    )


def table_from_dict(d: Dict[str, Any], where: str = "lut.json") -> Table:
    """Parse a ``lut.json`` document, checking schema, version, every field and the shape; ``LutError`` otherwise."""
    return _table(record.decode(msgspec.json.encode(d), where))


def read_table(path: Union[str, Path], bundle: Optional[Union[str, Path]] = None) -> Table:
    """Read ``lut.json`` once (the table carries the sha256 of the bytes read); with ``bundle``, also
    check it was built for that bundle's manifest, bands on the thermal signal its target reads, and
    names only that bundle's artefacts."""
    path = Path(path)
    data = codec.read_bytes(path, "lookup table", record.HINT, LutError)
    table = _table(record.decode(data, str(path)), hashlib.sha256(data).hexdigest())
    if bundle is not None:
        manifest = Path(bundle) / MANIFEST
        actual = sha256_file(manifest) if manifest.is_file() else None
        if actual != table.manifest_sha256:
            raise LutError(f"{path} was built for another bundle (manifest sha256 {table.manifest_sha256[:12]}, "
                           f"{manifest} has {actual and actual[:12]}); re-run hydra-edge lut")
        recorded = read_manifest(manifest)
        problem = thermal_source_problem(table.thermal_source, target_thermal_source(recorded.target),
                                         f"the target of {manifest} ({recorded.target.get('name')!r})")
        if problem:
            raise LutError(f"{path}: $.thermal.source: {problem}")
        artefacts = recorded.by_id()
        for i, c in enumerate(table.candidates):
            a = artefacts.get(c.artefact)
            if a is None:
                raise LutError(f"{path}: $.candidates[{i}].artefact: {c.artefact!r} is not an artefact of {manifest}; "
                               "re-run hydra-edge lut")
            # Every field the switcher acts on, so a candidate cannot claim another file or runtime.
            for field in ("heads", "file", "sha256", "format", "threads"):
                if getattr(c, field) != getattr(a, field):
                    raise LutError(f"{path}: $.candidates[{i}].{field}: {getattr(c, field)!r}, but {manifest} has "
                                   f"{getattr(a, field)!r} for {c.artefact}; re-run hydra-edge lut")
    return table
