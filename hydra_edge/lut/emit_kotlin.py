"""``HydraLut.kt``: the lookup table and its selection as one Kotlin ``object`` for Android apps.

Mirrors ``hydra_edge.runtime.lut.Table.select`` line for line. On a phone, pass
``PowerManager.getCurrentThermalStatus()`` as ``thermal`` and ``BatteryManager`` capacity as
``batteryPct``, and ``Double.NaN`` for either when it cannot be read (a capacity outside 0..100
included). No package line: put the file in the app's package and add one.
"""

from __future__ import annotations

from typing import Any

from .emit import literals

TEMPLATE = """\
/*
{comment}
 */
object HydraLut {{
    @JvmField val HEADS = intArrayOf({heads})
    private val THERMAL_EDGES = doubleArrayOf({thermal_edges})
    private val BATTERY_MIN_PCT = doubleArrayOf({battery_min_pct})
    private val CELLS = arrayOf(
{cells}
    )
    const val THERMAL_MARGIN = {thermal_margin}
    const val BATTERY_MARGIN_PCT = {battery_margin_pct}
    const val MIN_DWELL_S = {min_dwell_s}
    const val BUDGET_MS = {budget_ms}
    private val BUDGET_SCALE = doubleArrayOf({budget_scale})
    /** Each candidate's calibrated latency (ms), as HEADS: the base a slow-down is measured against. */
    @JvmField val LATENCY_MS = doubleArrayOf({latency_ms})
    const val MANIFEST_SHA256 = "{manifest_sha256}"
    /** Class names in logit order: CLASSES[index of the largest logit]; empty when unknown. */
    @JvmField val CLASSES = arrayOf<String>({classes})
{throttled}
    /** Double.NaN (unknown) is the hottest band. */
    @JvmStatic fun thermalBand(thermal: Double): Int =
        if (thermal.isNaN()) THERMAL_EDGES.size else THERMAL_EDGES.count {{ thermal >= it }}

    /** Double.NaN (unknown, unlike -1 for no battery) is the lowest band. */
    @JvmStatic fun batteryBand(batteryPct: Double, charging: Boolean): Int {{
        if (batteryPct.isNaN()) return BATTERY_MIN_PCT.size
        if (charging || batteryPct < 0) return 0
        for (i in BATTERY_MIN_PCT.indices) if (batteryPct >= BATTERY_MIN_PCT[i]) return i + 1
        return BATTERY_MIN_PCT.size
    }}

    /** The candidate index for a reading, without hysteresis. */
    @JvmStatic fun cell(batteryPct: Double, charging: Boolean, thermal: Double): Int =
        CELLS[batteryBand(batteryPct, charging)][thermalBand(thermal)]

    /** The latency budget now (ms): what a windowed p90 of this head count's timings must stay under. */
    @JvmStatic fun budget(batteryPct: Double, charging: Boolean): Double =
        BUDGET_MS * BUDGET_SCALE[batteryBand(batteryPct, charging)]

    /** The head count to run now. Worse cells are taken at once; better ones only after the dwell
     *  time, and only as far as they hold with the temperature and battery margins against them. */
    @JvmStatic fun select(batteryPct: Double, charging: Boolean, thermal: Double, prevHeads: Int,
                          sinceSwitchS: Double): Int {{
        val raw = cell(batteryPct, charging, thermal)
        val prev = HEADS.indexOf(prevHeads)
        if (prev < 0 || raw <= prev) return HEADS[raw]
        if (sinceSwitchS < MIN_DWELL_S) return HEADS[prev]
        val lowered = batteryPct - BATTERY_MARGIN_PCT
        val cautiousPct = if (batteryPct >= 0) (if (lowered > 0.0) lowered else 0.0) else batteryPct
        val safe = cell(cautiousPct, charging, thermal + THERMAL_MARGIN)
        val best = if (raw < safe) raw else safe
        return HEADS[if (best > prev) best else prev]
    }}
}}
"""


def kotlin_string(text: str) -> str:
    """``text`` as a Kotlin string literal, ASCII only: quotes, backslashes and ``$`` (a template) escaped,
    every other UTF-16 unit outside printable ASCII as ``\\uXXXX``."""
    utf16 = text.encode("utf-16-be")
    out = []
    for unit in (int.from_bytes(utf16[i:i + 2], "big") for i in range(0, len(utf16), 2)):
        char = chr(unit)
        out.append("\\" + char if char in '"\\$' else char if 0x20 <= unit < 0x7F else f"\\u{unit:04x}")
    return '"' + "".join(out) + '"'


def emit_kotlin(lut: dict[str, Any]) -> str:
    """The Kotlin source for a ``lut.json`` document."""
    lit = literals(lut)
    return TEMPLATE.format(
        comment="\n".join(f" * {line}" for line in lit.comment),
        heads=", ".join(lit.heads), thermal_edges=", ".join(lit.thermal_edges), manifest_sha256=lit.manifest_sha256,
        classes=", ".join(map(kotlin_string, lit.classes)),
        battery_min_pct=", ".join(lit.battery_min_pct),
        cells=",\n".join(f"        intArrayOf({', '.join(row)})" for row in lit.cells),
        thermal_margin=lit.thermal_margin, battery_margin_pct=lit.battery_margin_pct, min_dwell_s=lit.min_dwell_s,
        budget_ms=lit.budget_ms, budget_scale=", ".join(lit.budget_scale), latency_ms=", ".join(lit.latency_ms),
        throttled="" if lit.throttled_c is None else f"    const val THROTTLED_C = {lit.throttled_c}\n",
    )
