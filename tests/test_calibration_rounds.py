"""A calibration by rounds on the host: every round and block journalled as it comes (so a runner that
dies between rounds, or Ctrl-C, keeps them) and replayed after a crash; what calibrate says about
caps, drift and the thermal gate; and the time it says is left."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from hydra_edge.calibration_plan import interval_ms
from hydra_edge.measure.journal import BlockEntry, RecordWriter, journal_path, read_calibration
from hydra_edge.measure.rounds import findings, time_left
from hydra_edge.records.calibration import Block, Calibration, HeadResult, Round

SHA = "a" * 64


def _calibration() -> Calibration:
    return Calibration(device_id="local:x", device={}, bundle={"manifest_sha256": "0" * 64},
                       settings={"runs": 50, "rounds": {"within": 0.05}})


def _block(heads: int, round_no: int, ms: float, runs: int = 50) -> BlockEntry:
    return BlockEntry(heads=heads, artefact=f"h{heads}", sha256=SHA, runner="python",
                      block=Block(round=round_no, latencies_ms=[ms * (1 + 0.001 * i) for i in range(runs)],
                                  spent_s=ms * runs / 1e3))


def test_rounds_and_blocks_are_journalled_as_they_come_and_replayed_after_a_crash(tmp_path: Path) -> None:
    record = tmp_path / "cal.json"
    writer = RecordWriter(_calibration(), record)
    for round_no in (1, 2):
        writer.put_round(Round(round=round_no, order=[6, 3], started_s=round_no * 1.0,
                               gate={"waited_s": 0.5, "outcome": "ready"}))
        writer.put_block(_block(6, round_no, 2.0))
        writer.put_block(_block(3, round_no, 1.0))
    # killed here: no close(); what the journal holds beyond the record is read back
    replayed = read_calibration(record)
    assert [r.round for r in replayed.rounds] == [1, 2] and replayed.rounds[1].gate["waited_s"] == 0.5
    assert [(r.heads, r.status, [b.round for b in r.blocks]) for r in replayed.results] == \
        [(3, "timing", [1, 2]), (6, "timing", [1, 2])]
    assert replayed.measured() == []  # a head count still timing is no measurement for the table
    assert replayed.results[1].blocks[1].latencies_ms == _block(6, 2, 2.0).block.latencies_ms
    writer.close()
    assert not journal_path(record).exists() and read_calibration(record) == replayed


def test_the_record_is_folded_as_often_as_the_journal_doubles_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewriting the record after every block would cost O(n^2); it is rewritten when the journal holds
    as many entries as the record, so ~log2(n) times over n blocks."""
    record = tmp_path / "cal.json"
    writes = []
    real = Calibration.write

    def counted(self: Calibration, path: Path) -> Path:
        writes.append(path)
        return real(self, path)

    monkeypatch.setattr(Calibration, "write", counted)
    writer = RecordWriter(_calibration(), record)
    for round_no in range(1, 257):
        writer.put_block(_block(3, round_no, 1.0, runs=1))
    assert 8 <= len(writes) <= 10, len(writes)


def _timed(heads: int, stopped: str, latencies: list[float], low: float | None, high: float | None) -> HeadResult:
    return HeadResult(heads, f"h{heads}", SHA, "ok", "python", stopped=stopped,
                      latency={"count": len(latencies), "mean_ms": 1.0, "p90_ms": 10.0, "p90_low_ms": low,
                               "p90_high_ms": high},
                      blocks=[Block(round=i + 1, latencies_ms=[v], spent_s=v / 1e3) for i, v in enumerate(latencies)])


def test_calibrate_says_which_caps_ran_out_which_head_counts_drifted_and_what_the_gate_could_not_do() -> None:
    cal = _calibration()
    cal.put(_timed(3, "cap", [10.0] * 60, 9.0, 11.5))  # ±15 %: not the ±5 % asked
    cal.put(_timed(6, "cap", [10.0] * 10, None, None))
    cal.put(_timed(9, "interval", [10.0 + 0.01 * (i % 5) for i in range(100)], 9.9, 10.1))  # steady
    cal.put(_timed(12, "interval", [10.0] * 50 + [12.0] * 50, 9.9, 12.0))  # slowed for good half-way
    for n, gate in enumerate([{"waited_s": 0.0, "outcome": "ready"},
                              {"waited_s": 120.0, "outcome": "timeout", "why": "47.0 °C, over 40.0 + 2"},
                              {"waited_s": 3.0, "outcome": "reading failed",
                               "why": "the device no longer reports max_temp_c"},
                              {"waited_s": 120.0, "outcome": "timeout", "why": "46.0 °C, over 40.0 + 2"}], start=1):
        cal.add_round(Round(round=n, order=[3], started_s=float(n), gate=gate))
    lines = findings(cal)
    assert lines[0] == ("3 heads: its cap ran out with its p90 known to ±15.0 %, not ±5 % (60 runs); the table "
                        "plans on the interval's upper end (11.500 ms); raise --cap-seconds for a tighter one")
    assert lines[1].startswith("6 heads: its cap ran out after 10 runs, too few for a p90 interval")
    assert lines[2].startswith("12 heads: its earlier rounds' p90 (10.000 ms") and "the device drifted" in lines[2]
    assert lines[3] == ("2 round(s) started before the device was back in its start state, after waiting 120 s "
                        "(first: round 2, 47.0 °C, over 40.0 + 2); give it longer with --gate-max-wait")
    assert lines[4] == "1 round(s) were not gated: the device no longer reports max_temp_c (from round 3)"
    assert len(lines) == 5  # 9 heads: steady and met, nothing to say


def test_a_device_without_a_temperature_is_said_once() -> None:
    cal = _calibration()
    for n in (1, 2):
        cal.add_round(Round(round=n, order=[3], started_s=0.0,
                            gate={"waited_s": 0.0, "outcome": "ungated", "why": "the device reports no temperature"}))
    assert findings(cal) == ["the device reports no temperature: its rounds were not gated on the thermal state"]


def test_the_time_left_grows_with_the_runs_an_interval_still_needs_within_the_cap() -> None:
    """At ±w after n runs an interval needs n (w / within)^2: a head count at ±10 % of a 5 % goal needs four
    times its runs, three times more of its time; none is known before each has an interval."""
    cal = _calibration()
    assert time_left(cal, 0.05, 60.0) == 0.0
    ms = [10.0 * (1 + 0.02 * i) for i in range(50)]
    cal.add_block(3, "h3", SHA, "python", Block(round=1, latencies_ms=ms, spent_s=1.0))
    p90, low, high = interval_ms(ms)
    half = max(p90 - low, high - p90) / p90
    assert half > 0.05 and time_left(cal, 0.05, 60.0) == pytest.approx(50 * ((half / 0.05) ** 2 - 1) / 50)
    assert time_left(cal, 0.05, 1.1) == pytest.approx(0.1)  # never past the cap (1 s spent)
    cal.add_block(6, "h6", SHA, "python", Block(round=1, latencies_ms=[10.0] * 10, spent_s=0.1))
    assert time_left(cal, 0.05, 60.0) is None


def test_a_result_replaces_the_blocks_of_its_head_count(tmp_path: Path) -> None:
    cal = _calibration()
    cal.add_block(3, "h3", SHA, "python", Block(round=1, latencies_ms=[1.0], spent_s=0.1))
    cal.put(_timed(3, "interval", [1.0] * 3, 0.9, 1.1))
    assert [r.status for r in cal.results] == ["ok"] and len(cal.results[0].blocks) == 3
    cal.write(tmp_path / "cal.json")
    assert json.loads((tmp_path / "cal.json").read_text())["results"][0]["stopped"] == "interval"


def test_a_record_made_before_rounds_reads_and_writes_back_as_it_was() -> None:
    """The table the demo recorded on a project machine, one head count after another: no interval, no
    rounds, no blocks, and none added when it is written back."""
    path = Path(__file__).resolve().parents[1] / "calibration" / "recorded" / "x86_64-2core-digits-rpi.json"
    old = read_calibration(path)
    assert old.measured() and all(r.p90_interval_ms is None and r.stopped is msgspec.UNSET for r in old.results)
    assert old.rounds is msgspec.UNSET and findings(old) == []
    assert old.to_dict() == json.loads(path.read_text())
