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

A calibration by rounds appends each round and each block of runs as it comes too (``put_round``,
``put_block``), so a runner that dies between rounds, or Ctrl-C, loses at most the block in flight; the
fold counts them with the results.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

import msgspec

from ..errors import HydraEdgeError
from ..records import codec
from ..records.fields import Heads, Name, Sha256
from ..records.calibration import Block, Calibration, HeadResult, Round
from ..records.calibration import read_calibration as read_record

KIND = "hydra-edge/calibration-journal"
_TOO_DEEP = object()  # a line that is JSON but nests deeper than Python's parser goes: no journal entry


class BlockEntry(msgspec.Struct, forbid_unknown_fields=True):
    """A block of runs as the journal holds it: which head count's ``timing`` result it extends."""

    heads: Heads
    artefact: Name
    sha256: Sha256
    runner: Name
    block: Block


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
        if not isinstance(entry, dict) or not ({"device", "result", "round", "block"} & entry.keys()):
            raise HydraEdgeError(f"{where}: not a calibration journal entry; {hint}")
        if "device" in entry:
            calibration.device = codec.convert(entry["device"], Dict[str, Any], f"{where} device", hint)
        elif "round" in entry:
            calibration.add_round(codec.convert(entry["round"], Round, f"{where} round", hint))
        elif "block" in entry:
            block = codec.convert(entry["block"], BlockEntry, f"{where} block", hint)
            calibration.add_block(block.heads, block.artefact, block.sha256, block.runner, block.block)
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
        self._appended({"result": result.to_dict()})

    def put_round(self, round_: Round) -> None:
        self.calibration.add_round(round_)
        self._appended({"round": msgspec.to_builtins(round_)})

    def put_block(self, entry: BlockEntry) -> None:
        self.calibration.add_block(entry.heads, entry.artefact, entry.sha256, entry.runner, entry.block)
        self._appended({"block": msgspec.to_builtins(entry)})

    def _appended(self, entry: dict[str, Any]) -> None:
        """Journal ``entry``; fold once the journal holds as many entries as the record."""
        self._append(entry)
        self._pending += 1
        held = sum(1 + len(r.blocks or []) for r in self.calibration.results) + len(self.calibration.rounds or [])
        if 2 * self._pending >= held:
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
