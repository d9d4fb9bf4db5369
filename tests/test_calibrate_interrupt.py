"""hydra-edge calibrate when things go wrong around it: a connection dropped while the board stays
up, a second calibration of the same record, a calibrator killed between two saves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.bundles import make_bundle
from support.cli import invoke, one_line_error
from support.processes import descendants, held_elsewhere
from support.pythons import torch_free_python
from support.sshd import start_sshd
from support.targets import HOST_TARGET

from hydra_edge.errors import HydraEdgeError
from hydra_edge.measure.journal import RecordWriter, journal_path, read_calibration
from hydra_edge.measure.session import resume_or_start
from hydra_edge.records import calibration as records_calibration
from hydra_edge.records.calibration import Calibration, HeadResult

pytestmark = pytest.mark.slow  # converts a bundle and kills calibrations


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("onnx"), HOST_TARGET, "3,6,12")


@pytest.fixture(scope="module")
def chatty_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The device's Python, whose runtime says something on stderr (as LiteRT's INFO lines do)."""
    root = tmp_path_factory.mktemp("python")
    wrapper = root / "python-chatty"
    wrapper.write_text(f'#!/bin/sh\necho "INFO: Created a delegate for CPU." >&2\n'
                       f'exec "{torch_free_python(root)}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_dropped_connection_is_not_a_crash_and_the_next_run_measures_that_head_count(
        bundle: Path, chatty_python: Path, tmp_path: Path) -> None:
    """The board's sshd drops every connection (its listener stays up, so the board still answers) once a
    block is saved: the block in flight is lost, nothing is recorded as crashed, and a plain re-run goes
    on from the saved blocks."""
    server = start_sshd(tmp_path / "sshd")
    out = tmp_path / "board.json"
    args = ("--bundle", bundle, "--host", server.spec, "--identity", server.identity_file,
            "--known-hosts", server.known_hosts, "--remote-dir", tmp_path / "board", "--python", chatty_python,
            "--out", out, "--runs", 10000, "--warmup", 0)

    def drop_connections_after_first_block() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if out.exists() and any(r.blocks for r in read_calibration(out).results):
                for pid in descendants(server.pid):  # the connections and what they run; not the listener
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.02)

    dropper = threading.Thread(target=drop_connections_after_first_block)
    dropper.start()
    try:
        line = one_line_error(invoke(*args))
        dropper.join()
        assert f"the connection to ssh:{server.spec} dropped while timing" in line
        assert f"of 3 head counts measured and every block timed so far are saved in {out}" in line
        assert "crashed" not in line
        first = read_calibration(out)
        assert first.results and all(r.status == "timing" and r.blocks for r in first.results)
        again = invoke(*args)  # no --force
        assert again.exit_code == 0, again.output
    finally:
        dropper.join()
        server.stop()
    final = read_calibration(out)
    assert [(r.heads, r.status) for r in final.results] == [(3, "ok"), (6, "ok"), (12, "ok")]
    for r in first.results:  # went on from what was saved
        assert final.result(r.heads).blocks[:len(r.blocks)] == r.blocks


def test_a_second_calibration_of_the_same_record_says_who_holds_it_or_waits(
        bundle: Path, chatty_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "here.json"
    args = ["--bundle", str(bundle), "--local", "--python", str(chatty_python), "--out", str(out), "--runs", "5"]
    with held_elsewhere(tmp_path / "here.json.lock") as other:
        line = one_line_error(invoke(*args, "--no-wait"))
        assert line.startswith(f"Error: calibration record {out} is in use by pid {other.pid} on ")
        code = f"from hydra_edge.commands.calibrate import calibrate; calibrate({args!r})"
        waiting = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, "COLUMNS": "400"})
        assert waiting.stdout is not None
        said = waiting.stdout.readline()
        assert f"waiting for calibration record {out}: in use by pid {other.pid}" in said, said
        assert waiting.poll() is None and not out.exists()
    output, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, output
    assert [r.heads for r in read_calibration(out).measured()] == [3, 6, 12]


def _result(heads: int) -> HeadResult:
    """A result the size of a real one (latency statistics and two device states)."""
    state = {"timestamp": 1.0, "temps_c": {f"zone{i}": 45.0 for i in range(8)}, "battery_capacity": 80,
             "charging": False, "throttled": "0x0", "android_thermal_status": None}
    return HeadResult(heads, f"h{heads}_onnx_fp32", "ab" * 32, "ok", "python",
                      golden={"checked": True, "passed": True, "max_abs_diff": 1e-6},
                      load_s=0.01, latency={k: 1.0 for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms")},
                      peak_rss_mb=100.0, state_before=state, state_after=state)


def test_saving_per_head_count_writes_linearly_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """12 head counts saved one by one: the record rewrites add up to a few record sizes, not 12
    rewrites of a growing file (which is 6.5 records' worth)."""
    written: list[int] = []
    real = Calibration.write

    def counting(self: Calibration, path: Path) -> Path:
        real(self, path)
        written.append(Path(path).stat().st_size)
        return Path(path)

    monkeypatch.setattr(Calibration, "write", counting)
    cal = Calibration(device_id="local:x", device={}, bundle={"manifest_sha256": "0" * 64}, settings={"runs": 1})
    writer = RecordWriter(cal, tmp_path / "cal.json")
    for heads in range(1, 13):
        writer.put(_result(heads))
        assert len(read_calibration(tmp_path / "cal.json").results) >= heads / 2  # the file alone: at least half
    writer.close()
    final = written[-1]
    assert sum(written) <= 3.5 * final and len(written) <= 7, written
    assert read_calibration(tmp_path / "cal.json").results == cal.results
    assert not journal_path(tmp_path / "cal.json").exists()


def test_a_calibrator_killed_between_saves_loses_no_reported_result(tmp_path: Path) -> None:
    """SIGKILL after three results: two are in the record file, the third only in the journal (its
    last line torn by the kill); the reader the lookup table uses and the next run's resume have all three."""
    record = tmp_path / "cal.json"
    results = [_result(h).to_dict() for h in (3, 6, 12)]
    code = (f"import json, sys, time\nfrom pathlib import Path\n"
            f"from hydra_edge.measure.journal import RecordWriter\n"
            f"from hydra_edge.records.calibration import Calibration, HeadResult\n"
            f"cal = Calibration(device_id='local:x', device={{}}, bundle={{'manifest_sha256': '0' * 64}}, settings={{}})\n"
            f"writer = RecordWriter(cal, Path({str(record)!r}))\n"
            f"for r in json.loads({json.dumps(results)!r}):\n    writer.put(HeadResult(**r))\n"
            f"print('saved', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
    finally:
        proc.kill()
        proc.wait()
    with open(journal_path(record), "a") as journal:
        journal.write('{"result": {"heads": 9, "artef')  # as if the kill had cut a line short
    assert [r.heads for r in records_calibration.read_calibration(record).results] == [3, 6]  # the file alone
    assert [r.heads for r in read_calibration(record).results] == [3, 6, 12]  # what lut and the next run read
    resumed = resume_or_start(record, "local:x", {"manifest_sha256": "0" * 64}, {}, force=False)
    assert [r.heads for r in resumed.results] == [3, 6, 12]
    other = resume_or_start(record, "local:x", {"manifest_sha256": "1" * 64}, {}, force=True)
    assert other.results == []  # --force (or another bundle) starts over; the journal is not theirs


def test_a_journal_line_the_schema_refuses_names_the_journal_and_the_way_out(tmp_path: Path) -> None:
    """A whole journal line with 12 heads as "six" (not written by this calibrator, which checks every
    result): the reader lut uses and a re-run say which journal and line, and how to go on."""
    record = tmp_path / "cal.json"
    identity = {"manifest_sha256": "0" * 64}
    writer = RecordWriter(Calibration(device_id="local:x", device={}, bundle=identity, settings={}), record)
    writer.put(_result(3))
    with open(journal_path(record), "a") as journal:
        journal.write(json.dumps({"result": {**_result(12).to_dict(), "heads": "six"}}) + "\n")
    for read in (lambda: read_calibration(record),
                 lambda: resume_or_start(record, "local:x", identity, {}, force=False)):
        with pytest.raises(HydraEdgeError) as e:
            read()
        assert str(e.value) == (f"{journal_path(record)} line 2 result: $.heads: expected `int`, got `str`; "
                                f"delete {journal_path(record)} to keep only what {record} holds, "
                                "or calibrate again with --force")
    assert resume_or_start(record, "local:x", identity, {}, force=True).results == []
    journal_path(record).unlink()
    assert [r.heads for r in read_calibration(record).results] == [3]


def test_a_journal_line_nested_too_deep_stops_a_resumed_calibration_in_one_line(bundle: Path, tmp_path: Path) -> None:
    """A journal line that is JSON nested 100,000 deep (Python's parser gives up on it): the re-run
    says which journal and line, and how to go on, and leaves the record as it was."""
    out = tmp_path / "cal.json"
    args = ("--bundle", bundle, "--local", "--out", out, "--runs", 2, "--warmup", 0)
    assert invoke(*args).exit_code == 0
    RecordWriter(read_calibration(out), out)  # the record as saved, and this record's journal beside it
    with open(journal_path(out), "a") as journal:
        journal.write("[" * 100_000 + "]" * 100_000 + "\n")
    before = out.read_bytes()
    line = one_line_error(invoke(*args))
    assert line == (f"Error: {journal_path(out)} line 2 nests too deeply to be a calibration journal entry; "
                    f"delete {journal_path(out)} to keep only what {out} holds, or calibrate again with --force")
    assert out.read_bytes() == before
