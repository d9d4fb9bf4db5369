"""The records a phone reads too (lut.json, lut.correction.json, and manifest.json where the phone reads it)
get the same verdict from Python's readers (hydra_edge.records) and the Kotlin ones (apps/android-demo/core:
Lut.kt, Correction.kt, Manifest.kt), naming the same field, on hand-written faults and on thousands of
generated files.

Both readers find the first fault in one order (docs/android.md, "The readers"): the text (UTF-8, the
grammar, nesting, non-finite numbers, repeated keys), then the header, then the fields in the order the
schema declares them. The generated files (support.record_fuzz.mutated_file) carry one to four faults,
structural and byte-level, so that order is what they test.

Tiers: the fast one builds no Kotlin (the Maven build takes about a minute): the named cases (every file
that ever split the two readers, kept in tests/reader_cases with the verdict both give now) and a few
hundred generated files read by Python, each refused in one line of the reader's own error. The slow
one runs the same named cases and thousands of fresh files through both readers; set
HYDRA_EDGE_PARITY_FILES to run more. A divergence is written to a folder the failure names, to be kept
as a named case once the readers agree on it.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from support.record_fuzz import mutated_file
from support.tables import ANDROID_SIGNALS, PHONE_SIGNALS, fake_bundle, lut_document, table

from hydra_edge.errors import HydraEdgeError
from hydra_edge.records import codec
from hydra_edge.records import correction as correction_record
from hydra_edge.records import lut as lut_record
from hydra_edge.records import manifest as manifest_record
from hydra_edge.records.correction import CorrectionError
from hydra_edge.records.lut import LutError
from hydra_edge.records.manifest import Manifest
from hydra_edge.runtime.lut import read_table

CASES = Path(__file__).parent / "reader_cases"
# The records both sides read, each with Python's reader and its error, and the Kotlin main that reads it.
READERS: Dict[str, Tuple[Callable[[bytes, str], Any], type, List[str]]] = {
    "lut": (lut_record.decode, LutError, ["org.hydraedge.core.LutCheck"]),
    "correction": (correction_record.decode, CorrectionError, ["org.hydraedge.core.CorrectionCheck", "read"]),
    "manifest": (lambda data, where: codec.decode(data, Manifest, where, "manifest", manifest_record.HINT,
                                                  (manifest_record.SCHEMA, manifest_record.SCHEMA_VERSION)),
                 HydraEdgeError, ["org.hydraedge.core.ManifestCheck"]),
}
# What the phone reads of manifest.json (Manifest.kt): each artefact's fields below, and Manifest's own check
# that no artefact runs more heads than the model has. Python's reader checks the rest too.
PHONE_READS = ("id", "heads", "format", "file", "bytes", "sha256", "threads", "runtime", "compact")
PHONE_PATH = re.compile(r"\$\.artefacts(\[\d+\](\.(" + "|".join(PHONE_READS) + r")(\.(recipe|sha256))?)?)?")
SEED = int(os.environ.get("HYDRA_EDGE_PARITY_SEED", random.randrange(1 << 30)))


def python_verdict(record: str, data: bytes, where: str = "lut.json") -> Optional[str]:
    """None when Python's reader accepts, else the field path its one line names ("$" for the text)."""
    return python_refusal(record, data, where)[0]


def python_refusal(record: str, data: bytes, where: str = "lut.json") -> Tuple[Optional[str], str]:
    """(the field path Python's one line names, "$" for the text, or None when it reads the file; the line)."""
    decode, error, _ = READERS[record]
    try:
        decode(data, where)
    except error as e:
        message = str(e)
        assert "\n" not in message and message.startswith(where), message
        rest = message[len(where) + 2:]
        return rest.split(": ")[0] if rest.startswith("$") else "$", message
    return None, ""


def phone_reads(path: Optional[str], message: str) -> bool:
    """Whether the phone's manifest reader reads what Python refused at (or Python refused nothing)."""
    named = re.search(r"(?:missing required|unknown) field `([^`]*)`", message)
    if path is None or path in ("$.schema", "$.schema_version") or (path == "$" and not named):
        return True
    if not PHONE_PATH.fullmatch(path) or (named and named.group(1) not in PHONE_READS + ("recipe",)):
        return False
    return path != "$.artefacts" or "same id" in message


def kotlin_verdicts(classpath: str, record: str, files: List[Path], *args: str) -> List[Dict[str, Any]]:
    """The Kotlin reader's verdict on each file, in one JVM per thousand files; any exception but the
    reader's own ends the JVM with a trace, and the test with it."""
    verdicts: List[Dict[str, Any]] = []
    for start in range(0, len(files), 1000):
        chunk = files[start:start + 1000]
        done = subprocess.run(["java", "-cp", classpath, *READERS[record][2], *args, *map(str, chunk)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        verdicts += [json.loads(line) for line in done.stdout.splitlines()]
        assert len(verdicts) == start + len(chunk)
    return verdicts


def agree(python: Optional[str], kotlin: Dict[str, Any]) -> bool:
    return kotlin["refused"] == (python is not None) and (python is None or kotlin["path"] == python)


# -- the documents mutated ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lut_doc(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """lut.json as Python's table builder writes it for a 3/6/9/12-head phone bundle naming the headroom."""
    bundle = lut_document(tmp_path_factory.mktemp("lut"), {"latency_ms": {"3": 10, "6": 20, "9": 30, "12": 40},
                                                          "budget_ms": 41, "headroom": True})
    doc = json.loads((bundle / "lut.json").read_text())
    doc["classes"] = ["zero", "one", "two"]  # an optional field present, so its faults are generated too
    doc["bundle"]["path"], doc["calibration"]["path"] = "bundle", "cal.json"  # the same bytes in every run
    return doc


@pytest.fixture(scope="module")
def manifest_doc(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """manifest.json of a 3/6/12-head bundle, its middle artefact compact (a recipe), as the phone reads it."""
    bundle = fake_bundle(tmp_path_factory.mktemp("manifest") / "bundle", [3, 6, 12])
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["artefacts"][1]["compact"] = {"recipe": "vit_h6.recipe.json", "sha256": "4" * 64}
    return doc


@pytest.fixture(scope="module")
def correction_doc() -> Dict[str, Any]:
    doc = correction_record.CorrectionDocument(
        created_by="hydra-edge test", saved_at=1.75e9, manifest_sha256="a" * 64, lut_sha256="b" * 64, budget_ms=41.0,
        learned=[correction_record.LearnedLatency(heads=12, p90_ms=60.0, slowdown=1.5, samples=50),
                 correction_record.LearnedLatency(heads=6, p90_ms=25.0, slowdown=1.25, samples=7)])
    return json.loads(correction_record.encode(doc, "c"))


def generated(doc: Dict[str, Any], seed: int, count: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        yield mutated_file(doc, rng)


# -- named cases: every file that ever split the readers ------------------------------------------------

def named_cases() -> List[Tuple[str, str, Optional[str]]]:
    """(record, file name, the field both readers name or None) for each kept case."""
    verdicts = json.loads((CASES / "verdicts.json").read_text())
    return [(name.split("/")[0], name, path) for name, path in sorted(verdicts.items())]


def test_every_named_case_is_kept_with_its_verdict() -> None:
    kept = {f"{p.parent.name}/{p.name}" for p in CASES.glob("*/*") if p.is_file()}
    assert kept == {name for _, name, _ in named_cases()}
    assert all(sum(r == record for r, _, _ in named_cases()) >= 20 for record in ("lut", "correction"))


@pytest.mark.parametrize("record, name, expected", named_cases())
def test_python_reads_each_named_case_as_both_readers_agreed(record: str, name: str, expected: Optional[str]) -> None:
    assert python_verdict(record, (CASES / name).read_bytes()) == expected


@pytest.mark.parametrize("record", READERS)
def test_python_refuses_a_few_hundred_generated_files_in_one_line_of_its_own_error(
        record: str, lut_doc: Dict[str, Any], correction_doc: Dict[str, Any], manifest_doc: Dict[str, Any]) -> None:
    """No UnicodeDecodeError, RecursionError or any other trace: the reader's error, one line, a field."""
    doc = {"lut": lut_doc, "correction": correction_doc, "manifest": manifest_doc}[record]
    verdicts = []
    for i, data in enumerate(generated(doc, SEED, 300)):
        try:
            verdicts.append(python_verdict(record, data, f"{record}.json"))
        except Exception as e:  # noqa: BLE001 - any other exception is the failure this test looks for
            pytest.fail(f"seed {SEED}, file {i}: {type(e).__name__}: {e}\n{data[:400]!r}")
    assert sum(v is not None for v in verdicts) > 150 and None in verdicts, f"seed {SEED}"


@pytest.mark.slow
@pytest.mark.parametrize("record", ["lut", "correction", "manifest"])
def test_kotlin_reads_each_named_case_as_python_does(classpath: str, record: str) -> None:
    cases = [(name, expected) for r, name, expected in named_cases() if r == record]
    verdicts = kotlin_verdicts(classpath, record, [CASES / name for name, _ in cases])
    wrong = [(name, expected, k) for (name, expected), k in zip(cases, verdicts) if not agree(expected, k)]
    assert not wrong, wrong


# -- generated files through both readers ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("record, count", [("lut", 3000), ("correction", 1500)])
def test_both_readers_give_every_generated_file_one_verdict_at_one_field(
        classpath: str, record: str, count: int, lut_doc: Dict[str, Any], correction_doc: Dict[str, Any],
        tmp_path: Path) -> None:
    count = int(os.environ.get("HYDRA_EDGE_PARITY_FILES", count))
    doc = lut_doc if record == "lut" else correction_doc
    files, python = [], []
    for i, data in enumerate(generated(doc, SEED, count)):
        files.append(tmp_path / f"{record}{i}.json")
        files[-1].write_bytes(data)
        python.append(python_verdict(record, data))
    kotlin = kotlin_verdicts(classpath, record, files)
    split = [(f, p, k) for f, p, k in zip(files, python, kotlin) if not agree(p, k)]
    refused = sum(p is not None for p in python)
    print(f"{record}: seed {SEED}, {count} files, {refused} refused, {count - refused} read, {len(split)} split")
    assert not split, (f"seed {SEED}: {len(split)} of {count} files split the readers (kept in {tmp_path}): "
                       + "; ".join(f"{f.name}: Python {p}, Kotlin {k.get('path')} ({k.get('message')})"
                                   for f, p, k in split[:10]))
    assert 0.3 < refused / count < 0.95  # the mix holds files to read as well as faults


def manifest_boundaries(doc: Dict[str, Any]) -> Iterator[bytes]:
    """The manifest's edges the phone reads: as many heads as the model has and one more, no artefacts and a
    null list, a null and a bad recipe, two artefacts of one id."""
    def changed(edit: Callable[[Dict[str, Any]], Any]) -> bytes:
        d = json.loads(json.dumps(doc))
        edit(d)
        return json.dumps(d).encode()
    last = lambda d: d["artefacts"][-1]  # noqa: E731
    yield changed(lambda d: last(d).update(heads=12))
    yield changed(lambda d: last(d).update(heads=13))
    yield changed(lambda d: (d["model"].update(num_heads=6), last(d).update(heads=7)))
    yield changed(lambda d: d.pop("artefacts"))
    yield changed(lambda d: d.update(artefacts=None))
    yield changed(lambda d: d["artefacts"][1].update(compact=None))
    yield changed(lambda d: d["artefacts"][1]["compact"].update(recipe="../x.json"))
    yield changed(lambda d: d["artefacts"][2].update(id=d["artefacts"][0]["id"]))


@pytest.mark.slow
def test_both_readers_give_a_generated_manifest_one_verdict_where_the_phone_reads_it(
        classpath: str, manifest_doc: Dict[str, Any], tmp_path: Path) -> None:
    """Byte-level faults anywhere, structural ones (one at a time: the phone reads an artefact's fields in its
    own order) in the artefact fields the phone reads; compared where Python refuses a field the phone reads
    or nothing. The phone reading a manifest Python refuses elsewhere is the rest of the manifest unread."""
    count = int(os.environ.get("HYDRA_EDGE_PARITY_FILES", 1500))
    rng = random.Random(SEED)
    files, python = [], []
    structural = PHONE_PATH.pattern + r"|\$\.artefacts\[\d+\]"  # an artefact removed or swapped too
    for i, data in enumerate([*manifest_boundaries(manifest_doc),
                              *(mutated_file(manifest_doc, rng, only=structural, most=1) for _ in range(count))]):
        files.append(tmp_path / f"manifest{i}.json")
        files[-1].write_bytes(data)
        python.append(python_refusal("manifest", data, "manifest.json"))
    kotlin = kotlin_verdicts(classpath, "manifest", files)
    compared = [(f, p, k) for f, (p, m), k in zip(files, python, kotlin) if phone_reads(p, m)]
    split = [(f, p, k) for f, p, k in compared if not agree(p, k)]
    print(f"manifest: seed {SEED}, {count} files, {len(compared)} compared, {len(split)} split")
    assert not split, (f"seed {SEED}: {len(split)} of {len(compared)} manifests split the readers (kept in "
                       f"{tmp_path}): " + "; ".join(f"{f.name}: Python {p}, Kotlin {k.get('path')} "
                                                    f"({k.get('message')})" for f, p, k in split[:10]))
    assert len(compared) > count / 2 and sum(p is not None for p, _, _ in compared) > count / 4


# -- hand-written faults: each one a reader must refuse, or a change it must accept --------------------------

def mutations(doc: Dict[str, Any]) -> Iterator[tuple]:
    """(name, mutated document or raw text): each one fault a reader must refuse, or a change it must accept."""
    def changed(edit: Callable[[Dict[str, Any]], Any]) -> Dict[str, Any]:
        d = json.loads(json.dumps(doc))
        edit(d)
        return d

    c0 = lambda d: d["candidates"][0]  # noqa: E731
    n = len(doc["candidates"])
    yield "as written", doc
    yield "extra top-level field", changed(lambda d: d.update(extra=1))
    yield "extra candidate field", changed(lambda d: c0(d).update(extra=1))
    yield "missing budget", changed(lambda d: d.pop("budget_ms"))
    yield "budget zero", changed(lambda d: d.update(budget_ms=0))
    yield "budget int", changed(lambda d: d.update(budget_ms=41))
    yield "budget string", changed(lambda d: d.update(budget_ms="41"))
    yield "budget bool", changed(lambda d: d.update(budget_ms=True))
    yield "budget huge", changed(lambda d: d.update(budget_ms=1e13))
    yield "heads zero", changed(lambda d: c0(d).update(heads=0))
    yield "heads 129", changed(lambda d: c0(d).update(heads=129))
    yield "heads float", changed(lambda d: c0(d).update(heads=3.0))
    yield "heads bool", changed(lambda d: c0(d).update(heads=True))
    yield "threads 0", changed(lambda d: c0(d).update(threads=0))
    yield "negative latency", changed(lambda d: c0(d).update(latency_ms=-1.0))
    yield "sha256 upper case", changed(lambda d: c0(d).update(sha256="A" * 64))
    yield "sha256 short", changed(lambda d: c0(d).update(sha256="a" * 63))
    yield "sha256 trailing newline", changed(lambda d: c0(d).update(sha256="a" * 64 + "\n"))
    yield "unknown format", changed(lambda d: c0(d).update(format="coreml"))
    yield "file escapes", changed(lambda d: c0(d).update(file="../etc/passwd"))
    yield "file absolute", changed(lambda d: c0(d).update(file="/etc/passwd"))
    yield "file backslash", changed(lambda d: c0(d).update(file="a\\b"))
    yield "file home", changed(lambda d: c0(d).update(file="~/x"))
    yield "empty artefact name", changed(lambda d: c0(d).update(artefact=""))
    yield "no candidates", changed(lambda d: d.update(candidates=[]))
    yield "same heads twice", changed(lambda d: d["candidates"][1].update(heads=d["candidates"][0]["heads"]))
    yield "slower first", changed(lambda d: c0(d).update(latency_ms=1000.0))
    yield "more heads faster", changed(lambda d: (c0(d).update(heads=11)))
    yield "edges falling", changed(lambda d: d["thermal"].update(edges=list(reversed(d["thermal"]["edges"]))))
    yield "edges repeated", changed(lambda d: d["thermal"]["edges"].__setitem__(1, d["thermal"]["edges"][0]))
    yield "unknown thermal source", changed(lambda d: d["thermal"].update(source="sysfs"))
    yield "headroom named", changed(lambda d: d["thermal"].update(headroom=True))
    yield "headroom absent (older tables)", changed(lambda d: d["thermal"].pop("headroom"))
    yield "headroom null", changed(lambda d: d["thermal"].update(headroom=None))
    yield "headroom 1", changed(lambda d: d["thermal"].update(headroom=1))
    yield "headroom on a temperature table", changed(lambda d: d["thermal"].update(headroom=True, source="temperature"))
    yield "throttled_c missing", changed(lambda d: d["thermal"].pop("throttled_c"))
    yield "margin over 1000", changed(lambda d: d["thermal"].update(margin=1001.0))
    yield "battery rising", changed(lambda d: d["battery"].update(min_pct=list(reversed(d["battery"]["min_pct"]))))
    yield "battery over 100", changed(lambda d: d["battery"]["min_pct"].__setitem__(0, 101.0))
    yield "too few budget scales", changed(lambda d: d["battery"]["budget_scale"].pop())
    yield "scale zero", changed(lambda d: d["battery"]["budget_scale"].__setitem__(0, 0.0))
    yield "a row too short", changed(lambda d: d["selection"]["cells"][0].pop())
    yield "a row missing", changed(lambda d: d["selection"]["cells"].pop())
    # a cell indexes the candidates: every value from the last index up must be refused by the reader,
    # never reach the selection (Lut.neverMoreHeads would index past the list)
    for bad in (n, n + 1, 9, 2**31, 2**32, 2**53, -1):
        yield f"cell {bad} ({n} candidates)", changed(lambda d, v=bad: d["selection"]["cells"][3].__setitem__(6, v))
    yield f"cell {n} in the first cell", changed(lambda d: d["selection"]["cells"][0].__setitem__(0, n))
    yield f"cell {n - 1}, the last candidate, where the hottest band is (more heads when hotter)", changed(
        lambda d: d["selection"]["cells"][3].__setitem__(6, n - 1))
    yield "cell 0 everywhere", changed(lambda d: d["selection"].update(cells=[[0] * len(r)
                                                                            for r in d["selection"]["cells"]]))
    yield "hotter cell more heads", changed(lambda d: d["selection"]["cells"][1].__setitem__(1, 3))
    yield "lower battery more heads", changed(lambda d: d["selection"]["cells"][3].__setitem__(0, 3))
    yield "dwell negative", changed(lambda d: d["selection"].update(min_dwell_s=-1.0))
    yield "meets_budget not bool", changed(lambda d: d["selection"]["meets_budget"][0].__setitem__(0, 1))
    yield "policy unknown key", changed(lambda d: d["policy"].update(budget=1))
    yield "policy derating below 1", changed(lambda d: d["policy"]["thermal"]["derating"].__setitem__(0, 0.5))
    yield "policy derating count", changed(lambda d: d["policy"]["thermal"]["derating"].pop())
    yield "policy android derating count", changed(lambda d: d["policy"]["thermal"]["android_derating"].pop())
    yield "policy bands not ending at 0", changed(lambda d: d["policy"]["battery"]["bands"].pop())
    yield "policy without thermal", changed(lambda d: d["policy"].pop("thermal"))
    yield "policy thermal null", changed(lambda d: d["policy"].update(thermal=None))
    yield "policy battery null", changed(lambda d: d["policy"].update(battery=None))
    yield "classes repeated", changed(lambda d: d.update(classes=["a", "b", "a"]))
    yield "classes empty", changed(lambda d: d.update(classes=[]))
    yield "classes fine", changed(lambda d: d.update(classes=["a", "b"]))
    yield "classes null", changed(lambda d: d.update(classes=None))
    yield "other schema", changed(lambda d: d.update(schema="hydra-edge/bundle"))
    yield "version 2", changed(lambda d: d.update(schema_version=2))
    yield "version 1.0", changed(lambda d: d.update(schema_version=1.0))
    yield "calibration soak missing", changed(lambda d: d["calibration"].pop("soak"))
    yield "bundle target null", changed(lambda d: d["bundle"].update(target=None))
    yield "dominated entry", changed(lambda d: d["dominated"].append({"heads": 5, "latency_ms": 1.0, "accuracy": 1.0}))
    yield "two faults, the later field first in the file", changed(
        lambda d: (d.update(budget_ms=0), d["selection"].update(min_dwell_s=-1.0), d.update(
            {k: d.pop(k) for k in ["selection", "budget_ms"]})))
    yield "a missing field and a bad later one", changed(lambda d: (d.pop("created_by"), d.update(budget_ms=0)))
    yield "an unknown field before a bad one", changed(lambda d: d.update({"aaa": 1, **{k: d.pop(k) for k in list(d)}},
                                                                          budget_ms="x"))
    text = json.dumps(doc)
    yield "trailing comma", text[:-1] + ",}"
    yield "NaN", text.replace('"margin": 0.0', '"margin": NaN')
    yield "single quotes", text.replace('"created_by"', "'created_by'")
    yield "repeated key (last wins)", text[:-1] + ', "budget_ms": 0}'
    yield "repeated key (last valid)", '{"budget_ms": 0, ' + text[1:]
    yield "repeated key (both valid)", '{"budget_ms": 41.0, ' + text[1:]
    yield "repeated key, first a bad object", '{"policy": {"x": 1}, ' + text[1:]
    yield "repeated key, first a bad array", '{"candidates": [1], ' + text[1:]
    yield "number too large", text.replace('"margin": 0.0', '"margin": 1e400')
    yield "lone surrogate", text.replace('"created_by": "', '"created_by": "\\ud800')
    yield "lone low surrogate in a key", text.replace('"created_by"', '"created_by\\udc00"')
    yield "surrogate pair", text.replace('"created_by": "', '"created_by": "\\ud83d\\udc0d')
    classes = '"classes": ' + json.dumps(doc["classes"])
    assert classes in text
    for deep in (512, 513):  # arrays and objects open at once, the document's own included
        yield f"{deep} deep in classes", text.replace(classes, '"classes": ' + "[" * (deep - 1) + "]" * (deep - 1))
    yield "an integer of 4300 characters", text.replace('"margin": 0.0', '"margin": -1' + "0" * 4298)
    yield "an integer of 4301 characters", text.replace('"margin": 0.0', '"margin": -1' + "0" * 4299)
    yield "not an object", "[1, 2]"
    yield "empty", ""
    yield "invalid utf-8", b"\xff" + text.encode()
    yield "invalid utf-8 in a string", text.encode().replace(b'"created_by": "', b'"created_by": "\xc3')


@pytest.mark.slow
def test_kotlin_refuses_every_lut_python_refuses_at_the_same_field(
        classpath: str, lut_doc: Dict[str, Any], tmp_path: Path) -> None:
    cases, files = [], []
    for name, data in hand_written(lut_doc):
        files.append(tmp_path / f"case{len(cases)}.json")
        files[-1].write_bytes(data)
        cases.append((name, python_verdict("lut", data)))
    refused = 0
    for (name, python), k in zip(cases, kotlin_verdicts(classpath, "lut", files)):
        said = f"refuses at {python}" if python else "accepts"
        assert k["refused"] == (python is not None), f"{name}: Python {said}, Kotlin {k}"
        if python is not None:
            refused += 1
            assert k["path"] == python, f"{name}: Python refuses at {python}, Kotlin at {k['path']}: {k['message']}"
    assert 50 < refused < len(cases) - 8  # the list holds both: faults and changes a reader must accept


def hand_written(doc: Dict[str, Any]) -> Iterator[Tuple[str, bytes]]:
    for name, mutated in mutations(doc):
        yield name, mutated if isinstance(mutated, bytes) else \
            mutated.encode() if isinstance(mutated, str) else json.dumps(mutated).encode()


def test_python_names_the_first_fault_in_the_documented_order(lut_doc: Dict[str, Any]) -> None:
    """docs/android.md, "The readers": what the Kotlin reader is held to in the slow tier."""
    verdict = {name: python_verdict("lut", data) for name, data in hand_written(lut_doc)}
    n = len(lut_doc["candidates"])
    assert verdict[f"cell {n} ({n} candidates)"] == "$.selection.cells[3][6]"
    assert verdict["cell 0 everywhere"] is None  # the lowest index, everywhere, is a table
    assert verdict["two faults, the later field first in the file"] == "$.budget_ms"  # the schema's order
    assert verdict["a missing field and a bad later one"] == "$"  # created_by, declared first
    assert verdict["an unknown field before a bad one"] == "$.budget_ms"  # unknown fields after the known
    assert verdict["repeated key (both valid)"] == "$.budget_ms"  # the second occurrence
    assert verdict["repeated key, first a bad object"] == "$.policy"
    assert verdict["repeated key, first a bad array"] == "$.candidates"
    assert verdict["lone surrogate"] == verdict["lone low surrogate in a key"] == "$"
    assert verdict["surrogate pair"] is None
    assert verdict["512 deep in classes"] == "$.classes[0]" and verdict["513 deep in classes"] == "$"
    assert verdict["an integer of 4300 characters"] == "$.thermal.margin"
    assert verdict["an integer of 4301 characters"] == "$"
    assert verdict["invalid utf-8 in a string"] == verdict["invalid utf-8"] == "$"
    assert verdict["policy thermal null"] == "$.policy.thermal"


# -- what the phone reads a table with: the bundle's manifest -----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("signals, source", [(ANDROID_SIGNALS, "android"), (PHONE_SIGNALS, "android"),
                                             ({"commands": {"battery": "dumpsys battery"}}, "temperature")])
def test_the_phone_reads_only_a_table_on_the_thermal_status(
        classpath: str, tmp_path: Path, signals: Dict[str, Any], source: str) -> None:
    """The phone passes its thermal status to the table whatever its source: a table in °C is refused even
    where Python's reader takes it (a target that reads no thermal signal, so NaN, the hottest band)."""
    doc = table(tmp_path, {3: 10, 12: 40}, 45.0, signals=signals)
    assert doc["thermal"]["source"] == source
    lut = tmp_path / "lut.json"
    lut.write_bytes(lut_record.encode(doc, "lut.json"))
    read_table(lut, tmp_path / "bundle")  # Python's reader takes each
    [kotlin] = kotlin_verdicts(classpath, "lut", [lut], "--bundle", str(tmp_path / "bundle"))
    if source == "android":
        assert kotlin == {"refused": False}
    else:
        assert kotlin["path"] == "$.thermal.source" and "the Android thermal status" in kotlin["message"], kotlin


def test_python_refuses_the_same_as_its_reader_for_a_bundle_file(tmp_path: Path) -> None:
    """Invalid UTF-8 in a file read from disk (what the board app and android-app read) is one line too."""
    path = tmp_path / "lut.json"
    path.write_bytes(b'{"schema": "hydra-edge/lut\xff"}')
    with pytest.raises(HydraEdgeError) as e:
        read_table(path)
    assert str(e.value).startswith(f"{path}: not valid UTF-8 (byte 26") and "\n" not in str(e.value)
