"""The on-device switcher: read battery and thermal signals, pick a head count, run it.

``Switcher(bundle)`` reads ``bundle/lut.json`` and the signals named in the bundle's target
profile; ``poll()`` (or the background thread of ``start()``) applies the table with hysteresis;
``predict(image)`` runs the current subnetwork. Artefacts load lazily into a small cache and,
with ``prefetch``, the neighbours of the current head count (one up, one down in the table) load
in the background (queued after the first result of a new head count, so they never slow it
down): a switch to a neighbour costs a cache hit instead of a model load, and for a compact bundle
instead of a rebuild too. With prefetch the cache holds the current head count and its neighbours
only (at most three engines, once the new head count's first result is out); without, the
``cache_size`` most recently used. A neighbour that will not load (a tampered recipe, a missing
file) is logged in one line and the current model runs on; a switch to it tries again and falls
back to the fastest if it still fails; from then on, wherever the table picks a head count that
failed, the largest one below it that has not failed runs (never more than the table allows).
Every switch is logged in ``events`` (the latest ``max_events``; ``switches`` counts them all), with its reason.

A sensor that fails never buys heads (``failsafe``): its last good reading is held for the
profile's ``stale_after_s``, then the worst band is assumed; the head count rises only on a
reading that has persisted ``raise_after_s``, and a failing sensor is logged once, not per poll.
Each temperature sensor is held on its own and the hottest counts, a failed one included: a cooler
sensor never stands in for a hot one that stopped reading (where the profile reads every thermal
zone rather than naming its sensors, a zone counts once it has given a reading). A read that does
not return (a FIFO where a sensor was, a driver that hangs) never stops the polling: files open
without blocking, and a read that takes longer than ``read_timeout_s`` counts as every sensor
failing. On a phone whose table and profile name Android's thermal headroom, a forecast at or past 1.0
counts as at least SEVERE and a forecast that fails (NaN, an error, garbage) is held and then unknown,
like the thermal status. A battery the profile names but that cannot be read is unknown (the lowest battery
band), not mains; only a profile that names no battery (``battery = "none"``) means a board on mains.

With ``latency_loop`` (``LoopSettings``) the switcher also closes the loop on latency
(``latency_governor``, ``closed_loop``): ``predict`` times each single-image inference, and when
the running head count's p90 stays over the table's budget it runs fewer heads, returning after
the slow-down has gone (probed, not assumed). The governor only caps: what runs is the least of the
table's choice after the fail-safe rules and the cap, so a hot or failing sensor still wins. Each of
its switches names its reason ("latency p90 52 ms over budget 41 ms for 10 s at 12 heads: ...");
what it learns is saved beside lut.json (``lut.correction.json``) and used after a restart.

A ``lut.json`` that is missing, damaged, of another schema or built for another bundle is
reported in one line and the switcher runs the bundle's smallest head count instead of crashing.
No torch: numpy, msgspec (the records), the artefact's runtime and the standard library.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple, Union

import numpy as np

from ..errors import HydraEdgeError
from ..records.manifest import MANIFEST, read_manifest
from .engines import Engine
from ..records.target import signals as checked_signals
from .failsafe import Hold, Hottest, RaiseGate
from .closed_loop import LatencyLoop
from .latency_governor import LoopSettings
from .rebuild import load_record
from .lut import Candidate, LutError, Table, read_table
from .signals import (READ_TIMEOUT_S, THERMAL_SIGNALS, BoundedReader, DeviceState, Runner, configured,
                      reads_every_zone, run_command)
from .signals.android import THERMAL_STATUS_NAMES, thermal_status_name

log = logging.getLogger("hydra_edge.switcher")

# Switch events kept in ``Switcher.events``, the latest: a board serves for months (the fail-safe rules and
# the loop allow a few switches a minute), so the log is bounded; ``Switcher.switches`` counts them all.
MAX_EVENTS = 1000

# Android's thermal headroom (PowerManager.getThermalHeadroom): 1.0 is where SEVERE throttling begins, so a
# forecast at or past it counts as at least that status (the Kotlin library's Switcher does the same).
HEADROOM_SEVERE = 1.0
SEVERE = float(THERMAL_STATUS_NAMES.index("SEVERE"))


@dataclass(frozen=True)
class Reading:
    """The selection's inputs, after the fail-safe rules (a held reading, or the assumed worst)."""

    battery_pct: float  # -1: no battery; NaN: unknown
    charging: bool
    thermal: float  # in the table's thermal unit; NaN: unknown


class _Input(NamedTuple):
    """One input of the selection after the fail-safe rules."""

    value: Any
    note: Optional[str]  # why it is not this poll's own reading ("battery unknown since 31 s"), or None
    held: bool  # an older reading held over a failure: the head count may not rise on it


@dataclass(frozen=True)
class SwitchEvent:
    """One change of head count: when (the switcher's clock), at which poll, why, and on what reading."""

    time: float
    poll: int
    from_heads: Optional[int]
    to_heads: int
    reason: str  # "start", "state", "fallback: ...", "load failed: ..."; a failing sensor is added
    # after a colon: "state: thermal sensor cpu-thermal unknown since 31 s"; the latency loop's own
    # reasons start "latency", "probe" or, after a restart, "start; latency correction"
    reading: Optional[Reading]


@dataclass(frozen=True)
class Prediction:
    logits: np.ndarray  # (B, classes)
    heads: int  # the subnetwork that produced them
    ms: float  # the inference alone (the latency loop's timing): a model's load or rebuild before it is not in it


def fallback_table(bundle: Path) -> Table:
    """A one-cell table that always picks the bundle's smallest head count; a bundle with none (its
    convert was killed before the first artefact) is an error: there is nothing to run."""
    artefacts = read_manifest(bundle).artefacts
    if not artefacts:
        raise HydraEdgeError(f"{bundle / MANIFEST} lists no artefacts (its convert stopped before the first); "
                             "re-run hydra-edge convert for this bundle")
    smallest = min(artefacts, key=lambda a: a.heads)
    only = Candidate(heads=smallest.heads, artefact=smallest.id, file=smallest.file, sha256=smallest.sha256,
                     format=smallest.format, threads=smallest.threads, latency_ms=math.nan, accuracy=math.nan)
    return Table(candidates=(only,), cells=((0,),), thermal_source="temperature", thermal_headroom=False,
                 thermal_edges=(),
                 thermal_margin=0.0, throttled_c=None, battery_min_pct=(), battery_margin_pct=0.0,
                 min_dwell_s=0.0, manifest_sha256="")


def _failed(future: "Future[Any]") -> bool:
    """A load that ended without an engine (it raised, or was cancelled before it began)."""
    return future.done() and (future.cancelled() or future.exception() is not None)


class Switcher:
    """Runs the head count the lookup table picks for the device's current battery and thermal state.

    ``signals`` is a target profile's ``[signals]`` table (default: the bundle's target); ``root``
    and ``run`` let tests and hosts point the readers at a fake sysfs tree and canned commands.
    ``threads`` overrides the artefacts' thread count (default: the target's, at most one per core).
    ``prefetch`` loads the current head count's neighbours in the background and caches those three
    only; without it, ``cache_size`` engines stay loaded (least recently used first out).
    ``clock`` times dwell, sensor holds and events (monotonic by default; tests pass their own).
    ``read_timeout_s`` bounds one read of the signals (on a worker thread): one that has not returned
    by then, a driver or a command hanging, counts as every signal failing for that poll.
    ``signals`` also carries the fail-safe settings (``stale_after_s``, ``raise_after_s``,
    ``assumed_hot``), checked by ``records.target.Signals``).
    ``latency_loop`` turns the latency loop on with its settings (off by default: ``None``);
    ``timer`` times one inference for it (``clock`` times its windows and dwell), ``wall_clock``
    dates the correction it saves; tests pass fake ones.
    ``max_events``: how many of the latest switch events ``events`` keeps (``switches`` counts them all).
    """

    def __init__(self, bundle: Union[str, Path], lut: Optional[Union[str, Path]] = None,
                 signals: Optional[Mapping[str, Any]] = None, root: str = "/", run: Runner = run_command,
                 poll_s: float = 1.0, prefetch: bool = True, cache_size: int = 3, threads: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic, read_timeout_s: float = READ_TIMEOUT_S,
                 latency_loop: Optional[LoopSettings] = None, timer: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time, max_events: int = MAX_EVENTS) -> None:
        self.bundle = Path(bundle)
        self.poll_s, self.prefetch, self.clock, self.timer = poll_s, prefetch, clock, timer
        self.cache_size = max(1, cache_size)
        self.threads = threads
        manifest = read_manifest(self.bundle)
        self._records = manifest.by_id()
        self.signals = dict(signals if signals is not None else manifest.target.get("signals", {}))
        self.settings = checked_signals(self.signals, f"{self.bundle}/manifest.json target signals" if signals is None
                                        else "the switcher's signals")
        named = configured(self.signals)  # a value it cannot read is reported by the first poll
        self._has_battery = "battery" in named
        self._no_thermal = None if any(s in named for s in THERMAL_SIGNALS) else "the profile names no thermal signal"
        model = manifest.model
        self._input_shape = (1, model["in_chans"], model["img_size"], model["img_size"]) \
            if {"in_chans", "img_size"} <= set(model) else None
        self.max_events = max(1, max_events)
        self.events: List[SwitchEvent] = []  # the latest ``max_events`` switches, the oldest first
        self.switches = 0  # every switch since the start, those dropped from ``events`` included
        self._broken: Set[int] = set()  # head counts whose artefact would not load
        self.polls = 0
        self.heads: Optional[int] = None
        self._ceiling: Optional[int] = None  # the table's choice after the fail-safe rules: heads run at most this
        self._ceiling_at = -math.inf  # when it last changed: the table's dwell counts from then
        self._reading: Optional[Reading] = None  # the last poll's, for the latency loop's events
        self._notes: Tuple[str, ...] = ()  # the last poll's: why a signal is held or assumed
        # the latest write of the latency correction, queued on the loader thread, and what it writes
        self._saving: Optional[Tuple["Future[None]", bytes]] = None
        self._prefetch_due = False  # set by a switch, cleared once the neighbours are queued
        self._lock = threading.RLock()  # poll() and the cache, from the caller and the poll thread
        self._cache: "OrderedDict[int, Future[Engine]]" = OrderedDict()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydra-prefetch")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        lut_path = Path(lut) if lut is not None else self.bundle / "lut.json"
        self.loop: Optional[LatencyLoop] = None
        try:
            self.table = read_table(lut_path, self.bundle)
            self.fallback: Optional[str] = None
            if latency_loop is not None:
                self.loop = LatencyLoop(lut_path, self.table, latency_loop, wall_clock, log)
        except LutError as e:
            self.table, self.fallback = fallback_table(self.bundle), str(e)
            log.warning("%s; running the smallest head count (%d)", e, self.table.heads[0])
        hot = self.settings.assumed_hot
        unknown = math.nan if hot is None else hot
        assume = "the hottest band" if hot is None else f"{self._describe_thermal(hot)} (assumed_hot)"
        # the thermal signal as one value (Android's status, or no sensor at all), and temperature sensors one by one
        self._thermal: Hold[float] = Hold("thermal", self._describe_thermal, unknown, assume, self.settings, log)
        self._unknown_thermal = unknown
        # Android's thermal forecast counts where the table was built on it and these signals read it (a phone
        # that cannot forecast drops the profile's line; a table without it never asks for it)
        self._names_headroom = self.table.thermal_headroom and "headroom" in named
        self._headroom: Hold[float] = Hold("thermal headroom", lambda h: f"{h:g}", math.nan, assume, self.settings,
                                           log)
        self._sensors = Hottest(self._describe_thermal, unknown, assume, self.settings, log,
                                named=not reads_every_zone(self.signals))
        self._battery: Hold[Tuple[float, bool]] = Hold(
            "battery", lambda b: f"{b[0]:.0f} %{' charging' if b[1] else ''}", (math.nan, False),
            "the lowest battery band", self.settings, log)
        self._raise_gate = RaiseGate(self.settings.raise_after_s)
        self._read = BoundedReader(self.signals, root, run, read_timeout_s)

    # -- reading and choosing -------------------------------------------------------------------

    def _describe_thermal(self, thermal: float) -> str:
        if self.table.thermal_source == "android":
            return f"thermal status {thermal:g} ({thermal_status_name(int(thermal))})"
        return f"{thermal:.1f} °C"

    def _thermal_input(self, state: DeviceState, now: float) -> "_Input":
        """This poll's thermal input after the fail-safe rules: the hottest temperature sensor (each
        held on its own), or the thermal signal as one value (Android's status; no sensor at all)."""
        throttled = state.throttling is not None and state.throttling.any_now
        error = next((state.errors[s] for s in THERMAL_SIGNALS if s in state.errors), None)
        if self.table.thermal_source == "temperature":
            missing = error or "not found by this read"  # a sensor that counts, but was not reported
            temp, note = self._sensors.update(state.thermal_zones, state.zone_errors, missing, now)
            if temp is not None:  # unknown stays unknown: the hottest band, whatever a throttle bit says
                thermal = temp if math.isnan(temp) else self.table.thermal_input(temp, throttled)
                return _Input(thermal, note, self._sensors.held)
        thermal = self.table.thermal_input(state.max_temp_c, throttled, state.android_thermal_status)
        why = self._no_thermal or error or "no sensor gave a reading"
        value, note = self._thermal.update(None if math.isnan(thermal) else thermal, why, now)
        status = _Input(value, note, self._thermal.held)
        return self._with_forecast(status, state, now) if self._names_headroom else status

    def _with_forecast(self, status: "_Input", state: DeviceState, now: float) -> "_Input":
        """The hotter of the thermal status and Android's headroom forecast: a forecast at or past 1.0 is at
        least SEVERE (the phone says severe throttling is seconds away, whatever its status says now); one
        that fails is held like any signal, then unknown: the hottest band (or assumed_hot)."""
        why = state.errors.get("headroom", "no thermal headroom")
        headroom, note = self._headroom.update(state.android_thermal_headroom, why, now)
        forecast = self._unknown_thermal if math.isnan(headroom) else \
            SEVERE if headroom >= HEADROOM_SEVERE else -math.inf
        thermal = math.nan if math.isnan(status.value) or math.isnan(forecast) else max(status.value, forecast)
        if note is None and forecast > status.value:
            note = f"thermal headroom {headroom:g} counts as {THERMAL_STATUS_NAMES[int(SEVERE)]}"
        notes = ", ".join(n for n in (status.note, note) if n) or None
        return _Input(thermal, notes, status.held or self._headroom.held)

    def _battery_input(self, state: DeviceState, now: float) -> "_Input":
        """This poll's (battery %, charging) after the fail-safe rules: (-1, False) without a battery."""
        if not self._has_battery:
            return _Input((-1.0, False), None, False)
        if state.battery_capacity is None:
            value, note = self._battery.update(None, state.errors.get("battery", "no battery level"), now)
        else:
            value, note = self._battery.update((float(state.battery_capacity), bool(state.charging)), None, now)
        return _Input(value, note, self._battery.held)

    def poll(self) -> int:
        """Read the signals once and switch if the table says so; returns the head count now running."""
        state = self._read()  # device commands: outside the lock, so predict() never waits for a slow dumpsys
        with self._lock:
            self.polls += 1
            now = self.clock()
            thermal, battery = self._thermal_input(state, now), self._battery_input(state, now)
            battery_pct, charging = battery.value
            reading = Reading(battery_pct, charging, thermal.value)
            ceiling = self.table.select(battery_pct, charging, thermal.value, self._ceiling or 0,
                                        now - self._ceiling_at)
            ceiling = self._loadable(ceiling)
            if self._ceiling is not None:  # more heads only on a reading that has persisted
                order = self.table.heads
                fresh = not (thermal.held or battery.held)
                ceiling = order[self._raise_gate(order.index(self._ceiling), order.index(ceiling), now, fresh)]
            state = ceiling != self._ceiling
            if state:
                self._ceiling, self._ceiling_at = ceiling, now
            self._reading = reading
            self._notes = tuple(i.note for i in (thermal, battery) if i.note)
            latency = None
            if self.loop is not None:
                self.loop.budget(battery_pct, charging)
                latency = self._judge_latency(now)
            heads = self._limited()
            if heads != self.heads:
                reason = "start" if self.heads is None else "state" if state else ""  # "": the loop's alone
                if self.fallback and self.heads is None:
                    reason = f"fallback: {self.fallback}"
                if reason:
                    notes = [*self._notes]
                    notes += [f"held at {heads} heads by the latency loop"] if heads < ceiling and not latency else []
                    reason = f"{reason}: {', '.join(notes)}" if notes else reason
                self._switch(heads, "; ".join(r for r in (reason, latency) if r), reading, now)
            return heads

    def _limited(self) -> int:
        """The head count to run: the table's choice after the fail-safe rules, or the latency cap if lower."""
        assert self._ceiling is not None
        return self._ceiling if self.loop is None else self.loop.governor.limit(self._ceiling)

    def _judge_latency(self, now: float) -> Optional[str]:
        """The latency loop's verdict now, its reason if it has one; saves what it learned (lock held)."""
        assert self.loop is not None and self._ceiling is not None
        reason = self.loop.governor.step(self._limited(), self._ceiling, self.loop.budget_now, now)
        data = self.loop.snapshot()
        if data is not None:
            try:  # on the loader thread: an inference never waits for the disk
                self._saving = (self._loader.submit(self.loop.save, data), data)
            except RuntimeError:  # closed: nothing runs there any more
                self.loop.save(data)
        return reason

    def _observe(self, heads: int, ms: float) -> None:
        """Feed one inference's latency to the loop and switch if it says so."""
        assert self.loop is not None
        with self._lock:
            now = self.clock()
            self.loop.governor.observe(heads, ms, now)
            if self._ceiling is None:
                return
            reason = self._judge_latency(now)
            limited = self._limited()
            if limited != self.heads:
                self._switch(limited, reason or "latency", self._reading, now)

    def reasons(self, n: int = 5) -> List[str]:
        """The last ``n`` switches' reasons, the newest last: what a display says the device is doing and why."""
        with self._lock:
            return [e.reason for e in self.events[-n:]]

    @property
    def reading(self) -> Optional[Reading]:
        """The last poll's reading after the fail-safe rules (None before the first poll): what a display
        shows as the device's temperature and battery."""
        with self._lock:
            return self._reading

    @property
    def notes(self) -> Tuple[str, ...]:
        """What the last poll's reading stands on where it is not that poll's own: each signal held over a
        failure or assumed ("thermal unknown since 31 s", "battery unreadable, holding 64 % from 5 s ago")."""
        with self._lock:
            return self._notes

    def latency_status(self) -> Optional[Dict[str, Any]]:
        """The latency loop as JSON-ready data (its budget now, the budget before the battery band scaled it,
        cap, probe, p90s, ignored timings and recent decisions), or None when it is off."""
        if self.loop is None:
            return None
        with self._lock:
            return {"budget_ms": self.loop.budget_now, "planned_budget_ms": self.loop.budget_ms,
                    **self.loop.governor.status(self.clock())}

    def _loadable(self, heads: int) -> int:
        """``heads``, or the largest head count below it that has not failed to load (else the smallest).

        A count that failed once is not tried again at every dwell, and what replaces it must never
        be more than the table allows now: not the count running (it may be larger), the next one down.
        """
        allowed = [h for h in self.table.heads if h <= heads and h not in self._broken]
        return max(allowed, default=min(self.table.heads))

    def _switch(self, heads: int, reason: str, reading: Optional[Reading], now: float) -> None:
        event = SwitchEvent(now, self.polls, self.heads, heads, reason, reading)
        self.events.append(event)
        self.switches += 1
        if len(self.events) > self.max_events:
            del self.events[0]
        log.info("heads %s -> %d (%s) at poll %d: %s", event.from_heads, heads, reason, self.polls, reading)
        self.heads = heads
        self._prefetch_due = self.prefetch

    def _prefetch_neighbours(self) -> None:
        """Queue the neighbours' loads: after the first result, so they never compete with it for a core."""
        with self._lock:
            if not self._prefetch_due or self.heads is None:
                return
            self._prefetch_due = False
            self._evict()  # after the first result: freeing the old engines never delays it
            for neighbour in self._neighbours(self.heads):
                self._engine_future(neighbour, background=True)

    def _neighbours(self, heads: int) -> List[int]:
        order = self.table.heads
        i = order.index(heads)
        return [order[j] for j in (i - 1, i + 1) if 0 <= j < len(order)]

    # -- engines --------------------------------------------------------------------------------

    def _load(self, candidate: Candidate, warm: bool = False) -> Engine:
        """Load the artefact (``load_record`` checks its sha256, and rebuilds a compact one in memory);
        ``warm`` runs it once (a first run allocates). The table's candidates are the manifest's
        artefacts (``read_table`` checks it), so each has its record."""
        # never more threads than cores: oversubscribed runtimes spin and stall each other
        threads = self.threads or min(candidate.threads, os.cpu_count() or 1)
        engine = load_record(self.bundle, self._records[candidate.artefact], threads)
        if warm and self._input_shape is not None:
            engine.run(np.zeros(self._input_shape, np.float32))
        return engine

    def _engine_future(self, heads: int, background: bool) -> "Future[Engine]":
        """The cached (or loading) engine for ``heads``; loads it here, or on the prefetch thread."""
        with self._lock:
            future = self._cache.get(heads)
            if future is not None and not _failed(future):
                self._cache.move_to_end(heads)
                return future
            candidate = self.table.candidate(heads)
            if background:
                future = self._loader.submit(self._prefetch, candidate)
            else:
                future = Future()
                future.set_running_or_notify_cancel()  # loaded right here: never cancelled by an eviction
            self._cache[heads] = future
            self._evict()
        if not background:
            try:
                future.set_result(self._load(candidate))
            except Exception as e:  # noqa: BLE001 - handed to whoever waits on it
                future.set_exception(e)
        return future

    def _prefetch(self, candidate: Candidate) -> Engine:
        """A neighbour's load on the prefetch thread, warmed up; one line if it will not load (the
        current model is not touched, and a switch to it tries again)."""
        try:
            return self._load(candidate, warm=True)
        except Exception as e:  # noqa: BLE001 - logged here, raised to whoever waits on it
            said = (str(e).strip().splitlines() or [type(e).__name__])[0]
            log.warning("cannot prefetch %d heads (%s heads run on): %s", candidate.heads, self.heads, said)
            raise

    def _evict(self) -> None:
        """Bound the cache: with prefetch, everything but the current head count and its neighbours
        goes (a queued load is cancelled); without, the least recently used finished engines beyond
        ``cache_size``. The current head count's engine is never dropped."""
        with self._lock:
            if self.prefetch and self.heads is not None:
                keep = {self.heads, *self._neighbours(self.heads)}
                dropped = [self._cache.pop(h) for h in list(self._cache) if h not in keep]
                for future in dropped:
                    future.cancel()  # a load already running finishes, unreferenced
                if dropped and not self._stop.is_set():
                    # freeing an engine takes milliseconds (b16: ~170 MB): the prefetch thread does it,
                    # so a switch does not wait for it
                    self._loader.submit(dropped.clear)
                return
            for heads in list(self._cache):
                if len(self._cache) <= self.cache_size:
                    return
                if heads != self.heads and self._cache[heads].done():
                    del self._cache[heads]

    def cached(self) -> List[int]:
        """Head counts whose engine is loaded (for tests and the bench)."""
        with self._lock:
            return [h for h, f in self._cache.items() if f.done() and not _failed(f)]

    def wait_prefetch(self) -> None:
        """Block until every background job has finished: the loads (the bench's steady state) and
        the latest write of the latency correction."""
        with self._lock:
            pending = [*self._cache.values(), *([self._saving[0]] if self._saving is not None else [])]
        wait(pending)

    # -- running --------------------------------------------------------------------------------

    def predict(self, image: np.ndarray) -> Prediction:
        """Logits of the current subnetwork for one image (C, H, W) or a batch (B, C, H, W).

        An artefact that will not load is logged and the fastest candidate runs instead.
        """
        if self.heads is None:
            self.poll()
        heads = self.heads
        assert heads is not None
        x = np.asarray(image, dtype=np.float32)
        x = x[None] if x.ndim == 3 else x
        try:
            engine = self._engine_future(heads, background=False).result()
        except Exception as e:  # noqa: BLE001 - any runtime failure: fall back rather than crash
            fastest = self.table.heads[0]
            if heads == fastest:
                raise
            log.warning("cannot run %d heads (%s); running %d", heads, e, fastest)
            with self._lock:
                self._broken.add(heads)
                self._ceiling, self._ceiling_at = fastest, self.clock()
                self._switch(fastest, f"load failed: {e}", None, self._ceiling_at)
            return self.predict(x)
        start = self.timer()
        logits = engine.run(x)
        elapsed_s = self.timer() - start
        self._prefetch_neighbours()
        if self.loop is not None and len(x) == 1:  # the table's latencies are of one image
            self._observe(heads, elapsed_s * 1e3)
        return Prediction(logits, heads, elapsed_s * 1e3)

    def start(self) -> "Switcher":
        """Poll once now (so profile errors surface here), then every ``poll_s`` on a daemon thread."""
        self.poll()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_forever, name="hydra-switcher", daemon=True)
        self._thread.start()
        return self

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - a bad reading must not stop the device
                log.warning("poll failed: %s", e)

    def close(self) -> None:
        """Stop polling and the loader; queued loads are dropped, but not what the latency loop learned last:
        a write of it that the shutdown cancelled is done here, so a restart starts from it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._loader.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            saving = self._saving
        if saving is not None and saving[0].cancelled():
            assert self.loop is not None
            self.loop.save(saving[1])

    def __enter__(self) -> "Switcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def event_log(self) -> List[Dict[str, Any]]:
        """The switch events kept (the latest ``max_events``) as JSON-ready dicts."""
        with self._lock:
            return [event_record(e) for e in self.events]

    def events_since(self, seen: int) -> Tuple[List[SwitchEvent], int]:
        """The switches after the first ``seen`` (of those still kept) and the count to pass next time:
        what a display shows as they happen, at the cost of the new events only, however long the log."""
        with self._lock:
            new = min(self.switches - seen, len(self.events))
            return (self.events[-new:] if new > 0 else []), self.switches


def event_record(event: SwitchEvent) -> Dict[str, Any]:
    """One switch event as a JSON-ready dict (the ``--log`` file's and a display's form)."""
    return {"time": event.time, "poll": event.poll, "from": event.from_heads, "to": event.to_heads,
            "reason": event.reason, "reading": None if event.reading is None else event.reading.__dict__}
