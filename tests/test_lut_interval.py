"""The lookup table on a calibration by rounds: a head count fits a cell's budget only when the upper end
of its p90's 95 % interval does (x the band's derating); lut says each candidate's interval, and says so
when a head count's cap ran out before its interval was met. An older record (no intervals) builds as
it always did: tests/test_lut.py."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from support.tables import calibration, fake_bundle, heads_grid

from hydra_edge.lut.policy import Policy
from hydra_edge.lut.table import build_table
from hydra_edge.measure.journal import read_calibration
from hydra_edge.records.calibration import Block
from hydra_edge.records.manifest import read_manifest

# (p50, p90, p90 interval's low and high) in ms, per head count; stopped: why its timing stopped
TIMED = {3: (10.0, 11.0, 10.8, 11.4), 6: (20.0, 22.0, 21.5, 23.0), 12: (30.0, 33.0, 32.0, 36.0)}


def _table(tmp_path: Path, timed: dict, budget_ms: float, stopped: dict[int, str] = {},
           say: list[str] | None = None) -> dict:
    bundle = fake_bundle(tmp_path / "bundle", sorted(timed))
    cal = calibration(bundle, {h: v[0] for h, v in timed.items()})
    for r in cal.results:
        p50, p90, low, high = timed[r.heads]
        r.latency = {"count": 400, "mean_ms": p50, "p50_ms": p50, "p90_ms": p90, "max_ms": p90 + 8.0,
                     "p90_low_ms": low, "p90_high_ms": high, "timed_s": 4.0}
        r.stopped = stopped.get(r.heads, "interval")
        r.blocks = [Block(round=1, latencies_ms=[p50] * 400, spent_s=4.5)]
    cal.write(tmp_path / "cal.json")
    lines = [] if say is None else say
    return build_table(bundle, read_manifest(bundle), read_calibration(tmp_path / "cal.json"), tmp_path / "cal.json",
                       msgspec.structs.replace(Policy(), budget_ms=budget_ms), lines.append)


def test_a_head_count_fits_only_when_its_p90_intervals_upper_end_does(tmp_path: Path) -> None:
    """Budget 35 ms: 12 heads' median (30) and p90 (33) fit, the upper end of its interval (36) does not;
    the same medians in an older record (no interval) put 12 heads in the cool cell, as before."""
    doc = _table(tmp_path / "rounds", TIMED, budget_ms=35.0)
    assert heads_grid(doc)[0][0] == 6 and doc["selection"]["expected_ms"][0][0] == 23.0
    bundle = fake_bundle(tmp_path / "old" / "bundle", sorted(TIMED))
    old = calibration(bundle, {h: v[0] for h, v in TIMED.items()})
    old.write(tmp_path / "old" / "cal.json")
    before = build_table(bundle, read_manifest(bundle), old, tmp_path / "old" / "cal.json",
                         msgspec.structs.replace(Policy(), budget_ms=35.0))
    assert heads_grid(before)[0][0] == 12 and before["selection"]["expected_ms"][0][0] == 30.0


@pytest.mark.parametrize("budget_ms, heads", [(36.0, 12), (35.999, 6)])
def test_the_upper_end_exactly_at_the_budget_fits(tmp_path: Path, budget_ms: float, heads: int) -> None:
    assert heads_grid(_table(tmp_path, TIMED, budget_ms))[0][0] == heads


def test_the_derating_multiplies_the_upper_end(tmp_path: Path) -> None:
    """Default deratings 1, 1.15, 1.4, 2: at 60-70 °C 6 heads plans 23 x 1.15 = 26.45 ms."""
    doc = _table(tmp_path, TIMED, budget_ms=26.45)
    assert heads_grid(doc)[0][:3] == [6, 6, 3] and doc["selection"]["expected_ms"][0][1] == 26.45


def test_lut_says_each_candidates_interval_and_a_cap_that_ran_out_first(tmp_path: Path) -> None:
    said: list[str] = []
    _table(tmp_path, TIMED, budget_ms=100.0, stopped={12: "cap"}, say=said)
    assert said[0] == ("3 heads: p90 11.000 ms, 95 % interval 10.800-11.400 ms, 400 runs; fits a cell where "
                       "11.400 ms x its derating does")
    assert said[2].startswith("12 heads: p90 33.000 ms, 95 % interval 32.000-36.000 ms")
    assert said[2].endswith("its interval was NOT met before its time cap: calibrate it with a larger --cap-seconds")
    assert "NOT met" not in said[0] + said[1] and len(said) == 3


def test_a_head_count_without_an_interval_plans_on_its_slowest_run_and_says_so(tmp_path: Path) -> None:
    """Its cap ran out after too few runs for an interval: its slowest run, not its median, meets the budget."""
    said: list[str] = []
    timed = {**TIMED, 12: (30.0, 33.0, None, None)}
    doc = _table(tmp_path, timed, budget_ms=40.0, stopped={12: "cap"}, say=said)
    assert heads_grid(doc)[0][0] == 6  # 12 heads' slowest run: 33 + 8 = 41 ms > 40
    assert "12 heads: p90 33.000 ms, no interval (400 runs), its slowest run 41.000 ms" in said[2]
    assert json.loads((tmp_path / "cal.json").read_text())["results"][2]["stopped"] == "cap"
