"""``hydra_lut.h``: the lookup table and its selection as one C99 header (static data, inline functions).

Mirrors ``hydra_edge.runtime.lut.Table.select`` line for line; include it in the app's native code
and call ``hydra_lut_select`` once per poll (and, to keep the budget in service, hold each head
count's timings to ``hydra_lut_budget`` as the header's comment says). Unknown readings are NaN
(``NAN`` from ``math.h``), so the header must not be compiled with ``-ffast-math`` (which assumes
there is no NaN).
"""

from __future__ import annotations

from typing import Any

from .emit import literals

TEMPLATE = """\
/*
{comment}
 */
#ifndef HYDRA_LUT_H
#define HYDRA_LUT_H

#include <math.h> /* isnan, NAN: pass NAN for an unknown reading; do not build with -ffast-math */

#define HYDRA_LUT_CANDIDATES {n_heads}
#define HYDRA_LUT_BATTERY_BANDS {n_battery}
#define HYDRA_LUT_THERMAL_BANDS {n_thermal}
#define HYDRA_LUT_MANIFEST_SHA256 "{manifest_sha256}"
/* Class names in logit order, UTF-8: hydra_lut_classes[index of the largest logit]; 0 when unknown. */
#define HYDRA_LUT_CLASSES {n_classes}
{classes}{throttled}
static const int hydra_lut_heads[HYDRA_LUT_CANDIDATES] = {{{heads}}};
static const double hydra_lut_thermal_edges[HYDRA_LUT_THERMAL_BANDS - 1] = {{{thermal_edges}}};
static const double hydra_lut_battery_min_pct[HYDRA_LUT_BATTERY_BANDS - 1] = {{{battery_min_pct}}};
static const int hydra_lut_cells[HYDRA_LUT_BATTERY_BANDS][HYDRA_LUT_THERMAL_BANDS] = {{
{cells}
}};
static const double hydra_lut_thermal_margin = {thermal_margin};
static const double hydra_lut_battery_margin_pct = {battery_margin_pct};
static const double hydra_lut_min_dwell_s = {min_dwell_s};
static const double hydra_lut_budget_ms = {budget_ms};
static const double hydra_lut_budget_scale[HYDRA_LUT_BATTERY_BANDS] = {{{budget_scale}}};
static const double hydra_lut_latency_ms[HYDRA_LUT_CANDIDATES] = {{{latency_ms}}}; /* calibrated, as hydra_lut_heads */

static inline int hydra_lut_thermal_band(double thermal) {{
    if (isnan(thermal)) return HYDRA_LUT_THERMAL_BANDS - 1; /* unknown: the hottest band */
    int band = 0;
    for (int i = 0; i < HYDRA_LUT_THERMAL_BANDS - 1; i++) if (thermal >= hydra_lut_thermal_edges[i]) band++;
    return band;
}}

static inline int hydra_lut_battery_band(double battery_pct, int charging) {{
    if (isnan(battery_pct)) return HYDRA_LUT_BATTERY_BANDS - 1; /* unknown (not -1, no battery): the lowest band */
    if (charging || battery_pct < 0) return 0;
    for (int i = 0; i < HYDRA_LUT_BATTERY_BANDS - 1; i++) if (battery_pct >= hydra_lut_battery_min_pct[i]) return i + 1;
    return HYDRA_LUT_BATTERY_BANDS - 1;
}}

/* The candidate index for a reading, without hysteresis. */
static inline int hydra_lut_cell(double battery_pct, int charging, double thermal) {{
    return hydra_lut_cells[hydra_lut_battery_band(battery_pct, charging)][hydra_lut_thermal_band(thermal)];
}}

/* The latency budget now (ms): what a windowed p90 of this head count's timings must stay under. */
static inline double hydra_lut_budget(double battery_pct, int charging) {{
    return hydra_lut_budget_ms * hydra_lut_budget_scale[hydra_lut_battery_band(battery_pct, charging)];
}}

/* A candidate's calibrated latency (ms), the base a slow-down is measured against; -1 if not a candidate. */
static inline double hydra_lut_calibrated_ms(int heads) {{
    for (int i = 0; i < HYDRA_LUT_CANDIDATES; i++) if (hydra_lut_heads[i] == heads) return hydra_lut_latency_ms[i];
    return -1.0;
}}

/* The head count to run now. Worse cells are taken at once; better ones only after the dwell time,
   and only as far as they hold with the temperature and battery margins against them. */
static inline int hydra_lut_select(double battery_pct, int charging, double thermal, int prev_heads,
                                   double since_switch_s) {{
    int raw = hydra_lut_cell(battery_pct, charging, thermal);
    int prev = -1;
    for (int i = 0; i < HYDRA_LUT_CANDIDATES; i++) if (hydra_lut_heads[i] == prev_heads) prev = i;
    if (prev < 0 || raw <= prev) return hydra_lut_heads[raw];
    if (since_switch_s < hydra_lut_min_dwell_s) return hydra_lut_heads[prev];
    double lowered = battery_pct - hydra_lut_battery_margin_pct;
    double cautious_pct = battery_pct >= 0 ? (lowered > 0.0 ? lowered : 0.0) : battery_pct;
    int safe = hydra_lut_cell(cautious_pct, charging, thermal + hydra_lut_thermal_margin);
    int best = raw < safe ? raw : safe;
    return hydra_lut_heads[best > prev ? best : prev];
}}

#endif /* HYDRA_LUT_H */
"""


def c_string(text: str) -> str:
    """``text`` as a C string literal of its UTF-8 bytes, ASCII only: quotes, backslashes and ``?`` (trigraphs)
    escaped, every other byte outside printable ASCII as a three-digit octal escape (which, unlike ``\\x``,
    cannot swallow a digit after it)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        out.append("\\" + char if char in '"\\?' else char if 0x20 <= byte < 0x7F else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def emit_c(lut: dict[str, Any]) -> str:
    """The C header for a ``lut.json`` document."""
    lit = literals(lut)
    return TEMPLATE.format(
        comment="\n".join(f" * {line}" for line in lit.comment),
        n_heads=len(lit.heads), n_battery=len(lit.cells), n_thermal=len(lit.cells[0]),
        manifest_sha256=lit.manifest_sha256, n_classes=len(lit.classes),
        classes="" if not lit.classes else "static const char *const hydra_lut_classes[HYDRA_LUT_CLASSES] = {"
                                           f"{', '.join(map(c_string, lit.classes))}}};\n",
        throttled="" if lit.throttled_c is None else f"#define HYDRA_LUT_THROTTLED_C {lit.throttled_c}\n",
        heads=", ".join(lit.heads), thermal_edges=", ".join(lit.thermal_edges),
        battery_min_pct=", ".join(lit.battery_min_pct),
        cells=",\n".join(f"    {{{', '.join(row)}}}" for row in lit.cells),
        thermal_margin=lit.thermal_margin, battery_margin_pct=lit.battery_margin_pct, min_dwell_s=lit.min_dwell_s,
        budget_ms=lit.budget_ms, budget_scale=", ".join(lit.budget_scale), latency_ms=", ".join(lit.latency_ms),
    )
