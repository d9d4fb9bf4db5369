"""Build the lookup table: calibrated latencies x thermal derating against battery-scaled budgets.

Candidates are the device's Pareto-optimal head counts (no other is both at least as fast and at
least as accurate), each faster one running fewer heads. Each (battery band, thermal band) cell
gets the most accurate candidate whose expected latency (x the band's derating) meets the band's
budget (and energy cap, where power was measured); when none does, the fastest candidate. The
expected latency is the upper end of the p90's 95 % interval where the calibration timed by rounds
(the device judges a windowed p90 against the same budget), else, for an older record, the
calibrated median as before. No cell runs more heads than the cell one band cooler or one battery band fuller,
whatever the policy says. The result is the ``lut.json`` document; ``hydra_edge.runtime.lut``
reads it back on the device.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..atomic import sha256_file
from ..errors import HydraEdgeError
from ..measure.pareto import Point, pareto
from ..records.calibration import Calibration, Derating, HeadResult
from ..records.lut import SCHEMA, SCHEMA_VERSION
from ..records.manifest import MANIFEST, Manifest
from ..runtime.lut import target_thermal_source, thermal_source_problem
from ..runtime.signals import HEADROOM_RANGE, configured
from .policy import ANDROID_STATUSES, Policy


def _power(state: dict[str, Any] | None) -> float | None:
    return None if state is None else state.get("power_w")


def points(manifest: Manifest, calibration: Calibration, where: str = "the calibration",
           manifest_file: str | Path = "the manifest") -> tuple[list[Point], str]:
    """Calibrated points and the accuracy basis ("top1" or "heads" for random-input bundles).

    Each result must describe the artefact it names as the manifest does (head count, sha256):
    a table built from one that does not names a candidate the device refuses.
    """
    by_id = manifest.by_id()
    measured = calibration.measured()
    if not measured:
        raise HydraEdgeError("the calibration has no successful measurement; re-run hydra-edge calibrate")
    missing = [r.artefact for r in measured if r.artefact not in by_id]
    if missing:
        raise HydraEdgeError(f"the calibration measured artefacts this bundle lacks: {missing}")
    for r in measured:
        a = by_id[r.artefact]
        differs = [(f"{r.heads} heads", f"{a.heads} heads")] if r.heads != a.heads else []
        differs += [(f"sha256 {r.sha256[:12]}", f"sha256 {a.sha256[:12]}")] if r.sha256 != a.sha256 else []
        if differs:
            measured_as, recorded = (" and ".join(side) for side in zip(*differs))
            raise HydraEdgeError(f"{where}: artefact {r.artefact} was measured as {measured_as}, but {manifest_file} "
                                 f"has it as {recorded}; calibrate this bundle again")
    top1 = {r.heads: by_id[r.artefact].accuracy.get("top1") for r in measured}
    basis = "top1" if all(v is not None for v in top1.values()) else "heads"
    return [Point(r.heads, r.artefact, r.latency_ms, top1[r.heads] if basis == "top1" else float(r.heads),
                  _power(r.state_after) or _power(r.state_before), _plan_ms(r)) for r in measured], basis


def _plan_ms(result: HeadResult) -> float | None:
    """The upper end of the p90's interval; a head count timed by rounds without one (its cap ran out
    after too few runs) plans on its slowest run; an older record (no rounds): None."""
    interval = result.p90_interval_ms
    if interval is not None:
        return interval[1]
    return (result.latency or {}).get("max_ms") if result.stopped else None


def interval_lines(calibration: Calibration, front: list[Point]) -> list[str]:
    """One line per candidate timed by rounds: its p90 and the interval a cell's budget is checked
    against, and for one whose cap ran out first, that its interval was not met."""
    lines = []
    for p in front:
        r = calibration.result(p.heads)
        if r is None or r.latency is None or p.plan_ms is None:
            continue
        interval, lat = r.p90_interval_ms, r.latency
        known = (f"95 % interval {interval[0]:.3f}-{interval[1]:.3f} ms" if interval else
                 f"no interval ({lat.get('count')} runs), its slowest run {p.plan_ms:.3f} ms")
        unmet = ("; its interval was NOT met before its time cap: calibrate it with a larger --cap-seconds"
                 if r.stopped == "cap" else "; its interval was NOT met within the most runs a head count keeps: "
                 "its device's timings spread more than --within allows" if r.stopped == "runs" else "")
        lines.append(f"{p.heads} heads: p90 {lat.get('p90_ms', 0.0):.3f} ms, {known}, {lat.get('count')} runs; "
                     f"fits a cell where {p.plan_ms:.3f} ms x its derating does{unmet}")
    return lines


def thermal_source(policy: Policy, manifest: Manifest, soak: Derating | None) -> str:
    """The policy's source, which must fit what the bundle's target reads; ``auto``: what the target reads,
    or, for a target reading no thermal signal, Android when the soak saw thermal statuses."""
    reads = target_thermal_source(manifest.target)
    if policy.thermal.source != "auto":
        problem = thermal_source_problem(policy.thermal.source, reads, f"the bundle's target "
                                         f"({manifest.target.get('name')!r})")
        if problem:
            raise HydraEdgeError(f"policy [thermal] source: {problem}")
        return policy.thermal.source
    return reads or ("android" if soak and soak.by_thermal_status else "temperature")


NO_FORECAST = ("the phone gave no thermal headroom forecast during calibration: "
               "the table selects on its thermal status alone")


def gave_forecast(calibration: Calibration) -> bool:
    """Whether a device state the calibration recorded holds a usable thermal headroom forecast (a number
    within HEADROOM_RANGE). The states are the device's own JSON: anything else is no forecast."""
    low, high = HEADROOM_RANGE
    states = (s for r in calibration.results for s in (r.state_before, r.state_after) if isinstance(s, dict))
    values = (s.get("android_thermal_headroom") for s in states)
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high for v in values)


def names_headroom(source: str, manifest: Manifest, calibration: Calibration, say: Callable[[str], None]) -> bool:
    """Whether the device selects on Android's thermal headroom: an Android table whose target's signals
    name it (a ``cmd thermalservice headroom`` line) and whose calibration saw the phone forecast. A phone
    that never forecasts would otherwise run its fewest heads; ``say`` gets one line why it is left out.
    Recorded in lut.json, so the phone app knows too."""
    if source != "android" or "headroom" not in configured(manifest.target.get("signals", {})):
        return False
    if not gave_forecast(calibration):
        say(NO_FORECAST)
        return False
    return True


def _bins_max(bins: list[tuple[float, float]], width: float, lo: float, hi: float) -> float | None:
    """Largest soak multiplier among temperature bins [lower, lower + width) overlapping [lo, hi).

    A band the soak never reached has none: it keeps the policy's default, not the hottest bin's.
    """
    return max((m for lower, m in bins if lower < hi and lower + width > lo), default=None)


def thermal_axis(policy: Policy, source: str, soak: Derating | None) -> dict[str, Any]:
    """Band names, edges and one derating per band (soak where it covers the band, else default).

    Deratings never fall as bands get hotter (a cumulative maximum): a soak that never reached a
    band must not make it look faster than a cooler one.
    """
    t = policy.thermal
    if source == "android":
        measured = dict(soak.by_thermal_status) if soak else {}
        names = list(ANDROID_STATUSES)
        edges: list[float] = [float(s) for s in range(1, len(names))]
        found = [measured.get(n) for n in names]
        defaults, margin, throttled_c = list(t.android_derating), 0.0, None  # the OS already debounces its status
    else:
        edges, margin, throttled_c = list(t.edges_c), t.margin_c, t.throttled_c
        bounds = [-math.inf, *edges, math.inf]
        names = [f"<{edges[0]:g} °C", *(f"{a:g}-{b:g} °C" for a, b in zip(edges, edges[1:])), f">={edges[-1]:g} °C"] \
            if edges else ["any"]
        bins = list(soak.by_temperature) if soak else []
        found = [_bins_max(bins, soak.bin_c if soak else 0.0, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
        throttled = soak.by_throttled.get("true") if soak else None
        if throttled is not None and throttled_c is not None:
            hot = sum(1 for e in edges if throttled_c >= e)
            found = [max(f or 0.0, throttled) if i >= hot else f for i, f in enumerate(found)]
        defaults = list(t.derating)
    derating, basis, worst = [], [], 1.0
    for f, d in zip(found, defaults):
        worst = max(worst, f if f is not None else d)
        derating.append(worst)
        basis.append("soak" if f is not None else "default")
    return {"source": source, "names": names, "edges": edges, "margin": margin, "throttled_c": throttled_c,
            "derating": derating, "derating_basis": basis}


def battery_axis(policy: Policy) -> dict[str, Any]:
    b = policy.battery
    mins = [band.min_pct for band in b.bands]
    names = ["charging/mains", f">={mins[0]:g} %" if len(mins) > 1 else "discharging",
             *(f"{lo:g}-{hi:g} %" if lo > 0 else f"<{hi:g} %" for hi, lo in zip(mins, mins[1:]))]
    return {"names": names, "min_pct": mins, "margin_pct": b.margin_pct,
            "budget_scale": [b.charging_budget_scale, *(band.budget_scale for band in b.bands)],
            "max_energy_mj": [None, *(band.max_energy_mj for band in b.bands)]}


def _fewer_heads_first(front: list[Point]) -> tuple[list[Point], list[Point]]:
    """(candidates, dropped): the front, less any point with fewer heads than a faster one.

    On a HydraViT more heads are slower and more accurate, but noisy timings or accuracies can put a
    smaller head count behind a larger one on the front. The device ranks candidates by speed and takes
    rank for head count (lut.json's schema refuses a table where they disagree), so the faster one stays.
    """
    kept: list[Point] = []
    for p in front:
        if not kept or p.heads > kept[-1].heads:
            kept.append(p)
    return kept, [p for p in front if p not in kept]


def _choose(front: list[Point], budget: float, derating: float, max_energy: float | None,
            max_heads: float) -> tuple[int, bool]:
    """Index of the most accurate candidate of at most ``max_heads`` heads that fits, else the fastest
    of those; and whether one fit."""
    def fits(p: Point) -> bool:
        energy_ok = max_energy is None or p.power_w is None or p.planned_ms * derating * p.power_w <= max_energy
        return p.planned_ms * derating <= budget and energy_ok
    allowed = [i for i, p in enumerate(front) if p.heads <= max_heads]
    fitting = [i for i in allowed if fits(front[i])]
    return (fitting[-1], True) if fitting else (allowed[0], False)


def _max_heads(front: list[Point], rows_above: list[list[int]], row: list[tuple[int, bool]]) -> float:
    """The most heads the next cell of ``row`` may run: no more than the cell one thermal band cooler
    (its left) or one battery band fuller (above it). A policy may give a lower battery band more budget
    or energy than a fuller one; the table still never gives a device more heads as it drains or heats
    up (lut.json's schema refuses such a table)."""
    t = len(row)
    neighbours = ([rows_above[-1][t]] if rows_above else []) + ([row[-1][0]] if row else [])
    return min((front[i].heads for i in neighbours), default=math.inf)


def build_table(bundle: Path, manifest: Manifest, calibration: Calibration, calibration_path: Path,
                policy: Policy, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The ``lut.json`` document (schema ``hydra-edge/lut`` v1), bound to bundle and calibration by sha256;
    ``say`` gets a line per candidate timed by rounds (its p90's interval, and whether its cap ran out
    first) and a line for what the table leaves out (a thermal headroom forecast the phone never gave)."""
    if policy.budget_ms is None:
        raise HydraEdgeError("no latency budget: pass --budget-ms or set budget_ms in the policy file")
    manifest_sha = sha256_file(bundle / MANIFEST)
    if calibration.bundle.get("manifest_sha256") != manifest_sha:
        raise HydraEdgeError(f"{calibration_path} was measured on another bundle (manifest sha256 "
                             f"{str(calibration.bundle.get('manifest_sha256'))[:12]}, {bundle} has {manifest_sha[:12]}); "
                             "calibrate this bundle or pass its own calibration")
    pts, basis = points(manifest, calibration, str(calibration_path), bundle / MANIFEST)
    front, dominated = pareto(pts)
    front, out_of_order = _fewer_heads_first(front)
    dominated += out_of_order
    for line in interval_lines(calibration, front):
        say(line)
    source = thermal_source(policy, manifest, calibration.soak)
    thermal = {**thermal_axis(policy, source, calibration.soak),
               "headroom": names_headroom(source, manifest, calibration, say)}
    battery = battery_axis(policy)
    cells: list[list[int]] = []
    expected, meets = [], []
    for scale, cap in zip(battery["budget_scale"], battery["max_energy_mj"]):
        picks: list[tuple[int, bool]] = []
        for m in thermal["derating"]:
            picks.append(_choose(front, policy.budget_ms * scale, m, cap, _max_heads(front, cells, picks)))
        cells.append([i for i, _ in picks])
        meets.append([ok for _, ok in picks])
        expected.append([round(front[i].planned_ms * m, 3) for (i, _), m in zip(picks, thermal["derating"])])
    by_id = manifest.by_id()
    candidates = [{"heads": p.heads, "artefact": p.artefact, "file": by_id[p.artefact].file,
                   "sha256": by_id[p.artefact].sha256, "format": by_id[p.artefact].format,
                   "threads": by_id[p.artefact].threads, "latency_ms": p.latency_ms, "accuracy": p.accuracy,
                   "power_w": p.power_w} for p in front]
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created_by": f"hydra-edge {__version__}",
        "bundle": {"path": str(bundle), "manifest_sha256": manifest_sha, "target": manifest.target.get("name")},
        "calibration": {"path": str(calibration_path), "sha256": sha256_file(calibration_path),
                        "device_id": calibration.device_id, "soak": calibration.soak is not None},
        "budget_ms": policy.budget_ms,
        "policy": policy.to_dict(),
        "accuracy_basis": basis,
        "candidates": candidates,
        "dominated": [{"heads": p.heads, "latency_ms": p.latency_ms, "accuracy": p.accuracy} for p in dominated],
        "thermal": thermal,
        "battery": battery,
        "selection": {"cells": cells, "min_dwell_s": policy.min_dwell_s, "expected_ms": expected,
                      "meets_budget": meets},
        "classes": manifest.classes,  # so an app that ships only the table can name what it sees
    }
