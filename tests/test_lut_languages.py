"""One table, three languages: the C header (gcc) and the Kotlin object (kotlinc) pick the same head
count as ``hydra_edge.runtime.lut`` for every input of a grid around every band edge and margin,
unknown (NaN) battery and thermal readings included: those pick the worst band in all three."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.tables import ANDROID_SIGNALS, ODD_NAMES, table, table_with_classes

from hydra_edge.lut.emit_c import emit_c
from hydra_edge.lut.emit_kotlin import emit_kotlin
from hydra_edge.records.calibration import Derating
from hydra_edge.runtime.lut import table_from_dict

pytestmark = pytest.mark.slow  # compiles the emitted tables with gcc and kotlinc

C_MAIN = """#include <stdio.h>
#include "hydra_lut.h"
int main(void) {
    double battery, thermal, since; int charging, prev;
    while (scanf("%lf %d %lf %d %lf", &battery, &charging, &thermal, &prev, &since) == 5)
        printf("%d\\n", hydra_lut_select(battery, charging, thermal, prev, since));
    return 0;
}
"""
KOTLIN_MAIN = """fun main() {
    val out = StringBuilder()
    while (true) {
        val f = (readLine() ?: break).split(" ")
        out.append(HydraLut.select(f[0].toDouble(), f[1] == "1", f[2].toDouble(), f[3].toInt(), f[4].toDouble()))
        out.append('\\n')
    }
    print(out)
}
"""
NAN = float("nan")
BATTERY = [NAN, -1, 0, 10, 14, 15, 19, 20, 21, 24, 25, 26, 49, 50, 53, 54, 55, 56, 80, 100]
TEMPERATURE = [NAN, 20, 56.9, 57, 57.5, 59.99, 60, 61, 63, 66.9, 67, 69, 70, 72, 73, 77, 79.9, 80, 83, 95]
ANDROID = [NAN, 0, 0.5, 1, 2, 3, 4, 5, 6]


def _text(x: float) -> str:
    return "NaN" if x != x else repr(float(x))  # repr round-trips; C and the JVM both read "NaN"


@pytest.fixture(params=["temperature", "android"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    """A lut.json document with four distinct cells per row, and its input grid as text lines."""
    if request.param == "android":
        soak = Derating(heads=12, duration_s=60, samples=[], by_temperature=[],
                        by_thermal_status={"NONE": 1.0, "LIGHT": 1.3, "MODERATE": 1.9, "SEVERE": 3.5})
        doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, 41, soak=soak, signals=ANDROID_SIGNALS)
        thermal = ANDROID
    else:
        soak = Derating(heads=12, duration_s=60, samples=[], by_temperature=[(0, 1.0), (60, 1.3), (70, 1.9), (80, 3.5)])
        doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, 41, soak=soak)
        thermal = TEMPERATURE
    dwell = doc["selection"]["min_dwell_s"]
    prev = [0, 5, *(c["heads"] for c in doc["candidates"])]
    grid = itertools.product(BATTERY, (0, 1), thermal, prev, (0.0, dwell - 0.001, dwell, 100.0))
    return doc, [" ".join(_text(v) if isinstance(v, float) else str(v) for v in row) for row in grid]


def test_unknown_readings_pick_the_worst_band_not_the_best(case: tuple[dict[str, Any], list[str]]) -> None:
    t = table_from_dict(case[0])
    hottest, lowest = len(t.thermal_edges), len(t.battery_min_pct)
    assert t.thermal_band(NAN) == hottest and t.battery_band(NAN, False) == t.battery_band(NAN, True) == lowest
    assert t.battery_band(-1, False) == 0  # no battery (mains) is not unknown
    # at start-up (no previous head count) both unknown: the smallest head count of the table
    assert t.select(NAN, True, NAN, 0, 0.0) == t.heads[0] == t.candidates[t.cells[lowest][hottest]].heads
    # whatever the true reading was, unknown never picks more heads than knowing it would
    thermal = TEMPERATURE[1:] if t.thermal_source == "temperature" else ANDROID[1:]
    for prev, since, battery, charging, th in itertools.product((0, *t.heads), (0.0, 1e9), BATTERY[1:], (False, True),
                                                                thermal):
        known = t.select(battery, charging, th, prev, since)
        assert t.select(NAN, charging, th, prev, since) <= known
        assert t.select(battery, charging, NAN, prev, since) <= known


def python_picks(doc: dict[str, Any], lines: list[str]) -> list[str]:
    t = table_from_dict(doc)
    picks = []
    for line in lines:
        b, c, th, p, s = line.split()
        picks.append(str(t.select(float(b), c == "1", float(th), int(p), float(s))))
    return picks


def run(argv: list[str], lines: list[str]) -> list[str]:
    done = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_c_and_kotlin_pick_what_python_picks(case: tuple[dict[str, Any], list[str]], tmp_path: Path) -> None:
    doc, lines = case
    expected = python_picks(doc, lines)
    t = table_from_dict(doc)
    # the grid exercises hysteresis: some picks differ from the bare cell
    assert len(lines) > 5000 and len(set(expected)) == 4
    assert any(e != str(t.candidates[t.cell(float(l.split()[0]), l.split()[1] == "1", float(l.split()[2]))].heads)
               for e, l in zip(expected, lines))

    (tmp_path / "hydra_lut.h").write_text(emit_c(doc))
    (tmp_path / "main.c").write_text(C_MAIN)
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "pick"),
                    str(tmp_path / "main.c")], check=True, cwd=tmp_path)
    assert run([str(tmp_path / "pick")], lines) == expected

    assert shutil.which("kotlinc"), "kotlinc missing: apt-get install kotlin (Debian ships 1.3.31)"
    (tmp_path / "HydraLut.kt").write_text(emit_kotlin(doc))
    (tmp_path / "Main.kt").write_text(KOTLIN_MAIN)
    subprocess.run(["kotlinc", "-nowarn", "HydraLut.kt", "Main.kt", "-include-runtime", "-d", "pick.jar"],
                   check=True, cwd=tmp_path, capture_output=True, timeout=300)
    assert run(["java", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-jar", str(tmp_path / "pick.jar")], lines) == expected


def test_kotlin_names_the_classes_as_they_are(tmp_path: Path) -> None:
    """Quotes, backslashes, a ``$`` that would be a template, characters outside the BMP: each name exact."""
    assert shutil.which("kotlinc"), "kotlinc missing: apt-get install kotlin (Debian ships 1.3.31)"
    (tmp_path / "HydraLut.kt").write_text(emit_kotlin(table_with_classes(tmp_path, ODD_NAMES)))
    (tmp_path / "Main.kt").write_text("fun main() { for (name in HydraLut.CLASSES) println(name.codePoints().toArray()"
                                      ".joinToString(\" \")) }\n")
    subprocess.run(["kotlinc", "-nowarn", "HydraLut.kt", "Main.kt", "-include-runtime", "-d", "names.jar"],
                   check=True, cwd=tmp_path, capture_output=True, timeout=300)
    printed = subprocess.run(["java", "-Xshare:auto", "-jar", str(tmp_path / "names.jar")], capture_output=True,
                             text=True, check=True, timeout=120).stdout  # code points: no console encoding between
    assert printed.splitlines() == [" ".join(str(ord(c)) for c in name) for name in ODD_NAMES]
