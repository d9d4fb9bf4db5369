"""One writer per bundle or calibration record: a second process waits, saying who holds the lock,
or (asked not to wait) stops with that name."""

from __future__ import annotations

import json
import os
import platform
import threading
from pathlib import Path

import pytest
from support.processes import held_elsewhere

from hydra_edge.lock import LockedError, exclusive, holder, remove_unused


def test_a_held_lock_is_refused_naming_its_holder_or_waited_for(tmp_path: Path) -> None:
    lock_file = tmp_path / "record.json.lock"
    said: list[str] = []
    with held_elsewhere(lock_file) as other:
        with pytest.raises(LockedError, match=rf"^the record is in use by pid {other.pid} on .*--the-holder.*, since "):
            with exclusive(lock_file, "the record", wait=False):
                pass
        got = threading.Event()

        def waiter() -> None:
            with exclusive(lock_file, "the record", say=said.append):
                got.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        assert not got.wait(1.0)  # the holder still runs: the waiter must not get in
        assert said and said[0].startswith(f"waiting for the record: in use by pid {other.pid}")
    thread.join(timeout=30)
    assert got.is_set() and len(said) == 1
    with exclusive(lock_file, "the record", wait=False):  # released by the waiter too
        assert holder(lock_file).startswith(f"pid {os.getpid()} on ")
    assert holder(lock_file) == "another process (it has not said which yet)"  # no note left behind


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    """The kernel drops a dead process's lock: a crashed run never blocks the next one."""
    lock_file = tmp_path / ".lock"
    with held_elsewhere(lock_file) as other:
        other.kill()
        other.wait()
        with exclusive(lock_file, "the bundle", wait=False):
            pass


def test_a_lock_file_is_removed_only_when_no_process_holds_it(tmp_path: Path) -> None:
    """A run that stopped at its start removes its lock file after releasing it, but never one another run took
    meanwhile: that run would hold a file no later run could find, and the next would run beside it."""
    lock_file = tmp_path / ".lock"
    with held_elsewhere(lock_file):
        assert not remove_unused(lock_file) and lock_file.is_file()
    assert remove_unused(lock_file) and not lock_file.exists()


@pytest.mark.parametrize("since", [1e308, -1e20])
def test_a_holder_whose_note_has_an_impossible_time_is_named_in_one_line(tmp_path: Path, since: float) -> None:
    """Anyone can write the owner note; a time no clock can show must not crash the run that finds it."""
    from click.testing import CliRunner

    from hydra_edge.cli import main

    record = tmp_path / "cal.json"
    lock_file = record.with_name(record.name + ".lock")
    with held_elsewhere(lock_file) as other:
        note = lock_file.with_name(lock_file.name + ".owner")
        note.write_text(json.dumps({**json.loads(note.read_text()), "since": since}))
        result = CliRunner().invoke(main, ["calibrate", "--bundle", str(tmp_path / "bundle"), "--local",
                                           "--out", str(record), "--no-wait"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: calibration record {record} is in use by pid {other.pid} on {platform.node()} "
        f"(`-c --the-holder`, since an unknown time); wait for it to finish (or run without --no-wait to wait for it)"]
    assert not record.exists()
