"""Saving a calibration as it is measured, in linear total writing, atomic against a crash.

Rewriting the whole record after every head count costs O(n^2) over a run. Instead each result
is appended to ``<record>.journal`` (one JSON line, fsynced) and the record is rewritten
(atomically) only when the journal holds as many results as the record does, so the rewrites
grow geometrically (O(n) bytes in all) and the record file alone always holds at least half of
what was measured; closing folds the rest in and empties the journal. After a crash the next
run replays the journal (a torn last line, cut by the crash, is ignored), so nothing that was
reported is lost. The journal names the record it belongs to; one left from another device,
bundle or settings is ignored. A whole line of this record's journal that its schema refuses was
not written by this code (only checked results are appended): reading it is one error naming the
journal and how to go on (delete it, or calibrate again with --force), never a silent loss.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import HydraEdgeError
from ..records import codec
from ..records.calibration import Calibration, HeadResult
from ..records.calibration import read_calibration as read_record

KIND = "hydra-edge/calibration-journal"
_TOO_DEEP = object()  # a line that is JSON but nests deeper than Python's parser goes: no journal entry


def journal_path(record: Path) -> Path:
    return record.with_name(record.name + ".journal")


def _identity(calibration: Calibration) -> dict[str, Any]:
    return {"journal": KIND, "device_id": calibration.device_id,
            "manifest_sha256": calibration.bundle.get("manifest_sha256"), "settings": calibration.settings}


def replay(calibration: Calibration, record: Path) -> Calibration:
    """``calibration`` with the results its journal holds beyond it (in place, and returned)."""
    try:
        lines = journal_path(record).read_text().split("\n")
    except (OSError, UnicodeDecodeError):
        return calibration
    entries = []
    for line in lines[:-1]:  # the text after the last newline is a line the crash cut short
        try:
            entries.append(json.loads(line))
        except ValueError:
            return calibration  # not a journal this hydra-edge wrote: the record alone stands
        except RecursionError:
            entries.append(_TOO_DEEP)  # refused below if the journal is this record's
    if not entries or entries[0] != _identity(calibration):
        return calibration
    journal = journal_path(record)
    hint = f"delete {journal} to keep only what {record} holds, or calibrate again with --force"
    for number, entry in enumerate(entries[1:], start=2):
        where = f"{journal} line {number}"
        if entry is _TOO_DEEP:
            raise HydraEdgeError(f"{where} nests too deeply to be a calibration journal entry; {hint}")
        if not isinstance(entry, dict) or not ({"device", "result"} & entry.keys()):
            raise HydraEdgeError(f"{where}: not a calibration journal entry; {hint}")
        if "device" in entry:
            calibration.device = codec.convert(entry["device"], Dict[str, Any], f"{where} device", hint)
        else:
            calibration.put(codec.convert(entry["result"], HeadResult, f"{where} result", hint))
    return calibration


class RecordWriter:
    """Writes one calibration to ``record`` as results come: appended to the journal, folded in."""

    def __init__(self, calibration: Calibration, record: Path) -> None:
        self.calibration, self.record = calibration, record
        self._journal: Optional[Any] = None
        self._pending = 0  # results in the journal, not yet in the record file
        self.fold()

    def fold(self) -> None:
        """Rewrite the record with everything, then start an empty journal for it."""
        self.calibration.write(self.record)
        if self._journal is not None:
            self._journal.close()
        self._journal = open(journal_path(self.record), "w")
        self._pending = 0
        self._append(_identity(self.calibration))

    def _append(self, entry: dict[str, Any]) -> None:
        assert self._journal is not None
        self._journal.write(json.dumps(entry) + "\n")
        self._journal.flush()
        os.fsync(self._journal.fileno())

    def put(self, result: HeadResult) -> None:
        self.calibration.put(result)
        self._append({"result": result.to_dict()})
        self._pending += 1
        if 2 * self._pending >= len(self.calibration.results):  # the journal holds as many as the record
            self.fold()

    def set_device(self, device: dict[str, Any]) -> None:
        self.calibration.device = device
        self._append({"device": device})

    def close(self) -> None:
        """Fold everything into the record and remove the journal."""
        if self._journal is None:
            return
        self.calibration.write(self.record)  # atomic: the record holds everything before the journal goes
        self._journal.close()
        self._journal = None
        journal_path(self.record).unlink(missing_ok=True)


def read_calibration(path: str | Path) -> Calibration:
    """The record at ``path`` with every result its journal holds beyond it: what a calibrator
    killed mid-run reported is read by ``lut`` and the next run as if it had been folded in."""
    return replay(read_record(path), Path(path))
