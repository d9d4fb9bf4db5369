"""The Android switcher library (apps/android-demo/core, Kotlin on a plain JVM) decides as the board's
Python switcher does: proved on shared traces, not on hand-written expectations.

Each trace (apps/android-demo/core/src/test/resources/traces/*.json) scripts a phone step by step:
clock, thermal status and headroom, battery level and status (unreadable, NaN and out-of-range
values included), inference latencies, restarts and spoiled latency corrections. This test runs
it through Python's real ``Switcher`` (its signal readers fed by a fake ``dumpsys``, a fake clock and
timer, engines that only take the scripted time) and through the Kotlin ``TraceReplay`` on the built
jar, and asserts the same head count and the same switch reason at every poll and inference. The
same lut.json mutations are refused by both readers, at the same field. The Maven project is built
here (its own JUnit tests included), offline once install.sh has fetched its dependencies.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import pytest
from support.kotlin import CORE
from support.tables import lut_document
from support.trace_replay import bundles_for, first_difference, kotlin_batch, replay_python

from hydra_edge.records import lut as lut_record
from hydra_edge.records.lut import LutError
from hydra_edge.runtime.signals import read_state

pytestmark = pytest.mark.slow  # builds and tests the Kotlin library with Maven (about a minute)

TRACES = CORE / "src" / "test" / "resources" / "traces"
TRACE_FILES = sorted(TRACES.glob("*.json"))


def test_there_are_traces_for_every_rule() -> None:
    """Each rule the library mirrors is scripted by some trace (named in its "covers")."""
    covered = {rule for path in TRACE_FILES for rule in json.loads(path.read_text())["covers"]}
    rules = {"bands", "hysteresis", "dwell", "stale", "unknown thermal status", "headroom nan", "unreadable battery",
             "battery out of range", "assumed_hot", "raise_after", "latency down", "probe up", "probe fails",
             "switch rate", "absurd timings", "battery budget", "correction save and restore", "correction expired",
             "correction refused", "lut refused", "headroom severe", "headroom failed held then safe",
             "headroom recovery", "headroom not named", "equal timings window", "inference before any poll",
             "restart then inference"}
    assert rules <= covered, f"no trace covers {sorted(rules - covered)}"


@pytest.mark.parametrize("path", TRACE_FILES, ids=[p.stem for p in TRACE_FILES])
def test_kotlin_decides_as_python_at_every_step(path: Path, classpath: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = json.loads(path.read_text())
    python_bundle, kotlin_bundle = bundles_for(trace, tmp_path)
    python = replay_python(trace, python_bundle, monkeypatch)
    [kotlin] = kotlin_batch(classpath, [(path, kotlin_bundle)], tmp_path)
    assert "error" not in kotlin, kotlin
    assert len(python) > 0
    difference = first_difference(python, kotlin["out"])
    assert difference is None, f"{path.name} {difference}"
    # the trace must exercise what it claims: a switch at all, and each expected reason kind
    reasons = [p["reason"] for p in python if p["reason"]]
    for expected in trace.get("expect_reasons", []):
        assert any(expected in r for r in reasons), f"{path.name}: no switch reason contains {expected!r}: {reasons}"


# -- lut.json strictness: the same refusals, at the same field ----------------------------------------

def mutations(doc: Dict[str, Any]) -> Iterator[tuple]:
    """(name, mutated document or raw text): each one fault a reader must refuse, or a change it must accept."""
    def changed(edit: Callable[[Dict[str, Any]], Any]) -> Dict[str, Any]:
        d = json.loads(json.dumps(doc))
        edit(d)
        return d

    c0 = lambda d: d["candidates"][0]  # noqa: E731
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
    yield "cell names no candidate", changed(lambda d: d["selection"]["cells"][3].__setitem__(6, 9))
    yield "cell negative", changed(lambda d: d["selection"]["cells"][3].__setitem__(6, -1))
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
    text = json.dumps(doc)
    yield "trailing comma", text[:-1] + ",}"
    yield "NaN", text.replace('"margin": 0.0', '"margin": NaN')
    yield "single quotes", text.replace('"created_by"', "'created_by'")
    yield "repeated key (last wins)", text[:-1] + ', "budget_ms": 0}'
    yield "repeated key (last valid)", '{"budget_ms": 0, ' + text[1:]
    yield "number too large", text.replace('"margin": 0.0', '"margin": 1e400')
    yield "not an object", "[1, 2]"
    yield "empty", ""
    yield "invalid utf-8", b"\xff" + text.encode()


def python_verdict(data: bytes) -> Optional[str]:
    """None when Python's reader accepts, else the field path its one line names."""
    try:
        lut_record.decode(data, "lut.json")
    except LutError as e:
        message = str(e)
        rest = message[len("lut.json: "):]
        return rest.split(": ")[0] if rest.startswith("$") else "$"
    return None


def test_kotlin_refuses_every_lut_python_refuses_at_the_same_field(classpath: str, tmp_path: Path) -> None:
    bundle = lut_document(tmp_path, {"latency_ms": {"3": 10, "6": 20, "9": 30, "12": 40}, "budget_ms": 41})
    doc = json.loads((bundle / "lut.json").read_text())
    cases = []
    for name, mutated in mutations(doc):
        data = mutated if isinstance(mutated, bytes) else \
            mutated.encode() if isinstance(mutated, str) else json.dumps(mutated).encode()
        (tmp_path / f"case{len(cases)}.json").write_bytes(data)
        cases.append((name, python_verdict(data)))
    done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.LutCheck",
                           *(str(tmp_path / f"case{i}.json") for i in range(len(cases)))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    kotlin = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(kotlin) == len(cases)
    refused = 0
    for (name, python), k in zip(cases, kotlin):
        assert k["refused"] == (python is not None), f"{name}: Python {'refuses at ' + python if python else 'accepts'}, " \
                                                     f"Kotlin {k}"
        if python is not None:
            refused += 1
            assert k["path"] == python, f"{name}: Python refuses at {python}, Kotlin at {k['path']}: {k['message']}"
    assert 50 < refused < len(cases) - 4  # the list holds both: faults and changes a reader must accept


def test_a_thermal_status_outside_none_to_shutdown_is_no_reading_on_a_board_too() -> None:
    """What TraceReplay's phone and the library assume of the board's reader: -1 or 7 is garbage, not a band."""
    for status in (-1, 7, 99):
        state = read_state({"thermal": "dumpsys"}, run=lambda argv, s=status: f"Thermal Status: {s}\n")
        assert state.android_thermal_status is None and "is not one of NONE..SHUTDOWN" in state.errors["thermal"]
    assert read_state({"thermal": "dumpsys"}, run=lambda argv: "Thermal Status: 6\n").android_thermal_status == 6
