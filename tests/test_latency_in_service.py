"""The latency loop in service, outside the switcher: the table carries the budget it is held to (read
once, its sha256 with it), a table whose battery bands and budget scales disagree is refused in one
line, and the C header an app compiles computes the same budget and calibrated latencies Python does."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.tables import table

from hydra_edge.lut.emit_c import emit_c
from hydra_edge.lut.emit_kotlin import emit_kotlin
from hydra_edge.records.lut import LutError
from hydra_edge.runtime.closed_loop import LatencyLoop
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.lut import read_table, table_from_dict

NAN = float("nan")
BATTERY = [NAN, -1, 0, 10, 19.9, 20, 35, 49.9, 50, 80, 100]


@pytest.fixture
def doc(tmp_path: Path) -> dict[str, Any]:
    """A table of four head counts, budget 41 ms, whose battery bands scale it 1, 1, 0.75 and 0.5."""
    return table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, 41)


def test_the_table_read_once_carries_its_budget_and_the_sha256_of_its_bytes(doc: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "lut.json"
    path.write_text(json.dumps(doc))
    t = read_table(path)
    assert t.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert t.budget_ms == 41 and t.budget_scale == tuple(doc["battery"]["budget_scale"]) == (1.0, 1.0, 0.75, 0.5)
    # the budget the loop holds the p90 to, band by band, is the table's own
    loop = LatencyLoop(path, t, LoopSettings(), lambda: 0.0, logging.getLogger("test"))
    for battery, charging in itertools.product(BATTERY, (False, True)):
        assert t.budget(battery, charging) == loop.budget(battery, charging)
    assert t.budget(15, False) == 20.5 and t.budget(15, True) == 41 and t.budget(NAN, True) == 20.5


@pytest.mark.parametrize("scales", [[1.0, 1.0, 0.75], [1.0, 1.0, 0.75, 0.5, 0.25]])
def test_a_budget_scale_per_battery_band_or_one_line(doc: dict[str, Any], scales: list[float]) -> None:
    doc["battery"]["budget_scale"] = scales
    with pytest.raises(LutError) as e:
        table_from_dict(doc)
    assert "$.battery.budget_scale" in str(e.value) and f"{len(scales)} scales for 4 battery bands" in str(e.value)
    assert len(str(e.value).splitlines()) == 1 and "re-run hydra-edge lut" in str(e.value)


C_MAIN = """#include <stdio.h>
#include "hydra_lut.h"
int main(void) {
    double battery; int charging;
    while (scanf("%lf %d", &battery, &charging) == 2) printf("%.17g\\n", hydra_lut_budget(battery, charging));
    for (int heads = 0; heads <= 12; heads++) printf("%d %.17g\\n", heads, hydra_lut_calibrated_ms(heads));
    return 0;
}
"""


def test_the_c_header_gives_the_budget_and_calibrated_latencies_python_gives(doc: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    """What an app needs to feed its timings back, compiled as an app compiles it (warnings are errors)."""
    (tmp_path / "hydra_lut.h").write_text(emit_c(doc))
    (tmp_path / "main.c").write_text(C_MAIN)
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-o", "budget", "main.c"],
                   check=True, cwd=tmp_path, timeout=120)
    readings = list(itertools.product(BATTERY, (0, 1)))
    lines = "".join(f"{'NaN' if b != b else repr(float(b))} {c}\n" for b, c in readings)
    out = subprocess.run([str(tmp_path / "budget")], input=lines, capture_output=True, text=True, check=True,
                         timeout=60).stdout.splitlines()
    t = table_from_dict(doc)
    assert [float(x) for x in out[:len(readings)]] == [t.budget(b, bool(c)) for b, c in readings]
    calibrated = dict(line.split() for line in out[len(readings):])
    assert {int(h): float(ms) for h, ms in calibrated.items() if float(ms) >= 0} == {3: 10.0, 6: 20.0, 9: 30.0,
                                                                                        12: 40.0}


def test_the_c_and_kotlin_tables_say_how_an_app_feeds_its_timings_back(doc: dict[str, Any]) -> None:
    for source in (emit_c(doc), emit_kotlin(doc)):
        comment = source[:source.index("*/")]
        assert "latency_governor.py" in comment and "monotonic clock" in comment and "p90" in comment
        assert "budget_scale" in comment and "never above what select returns" in comment
    assert "const val BUDGET_MS = 41.0" in emit_kotlin(doc) and "doubleArrayOf(1.0, 1.0, 0.75, 0.5)" in emit_kotlin(doc)
