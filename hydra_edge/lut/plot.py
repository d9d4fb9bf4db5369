"""The table for people: a PNG grid of states coloured by head count, and a markdown summary."""

from __future__ import annotations

import io
from typing import Any



def _heads_grid(lut: dict[str, Any]) -> list[list[int]]:
    heads = [c["heads"] for c in lut["candidates"]]
    return [[heads[i] for i in row] for row in lut["selection"]["cells"]]


def plot_grid(lut: dict[str, Any]) -> bytes:
    """Battery bands (rows) x thermal bands (columns), each cell coloured and labelled by its head count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap

    grid = _heads_grid(lut)
    heads = sorted({c["heads"] for c in lut["candidates"]})
    colours = ListedColormap(plt.get_cmap("viridis")(
        [i / max(1, len(heads) - 1) for i in range(len(heads))]))
    norm = BoundaryNorm([h - 0.5 for h in heads] + [heads[-1] + 0.5], len(heads))
    thermal, battery = lut["thermal"]["names"], lut["battery"]["names"]
    fig, ax = plt.subplots(figsize=(1.3 * len(thermal) + 2.5, 0.7 * len(battery) + 1.6))
    image = ax.imshow(grid, cmap=colours, norm=norm, aspect="auto")
    meets = lut["selection"]["meets_budget"]
    expected = lut["selection"]["expected_ms"]
    for b, row in enumerate(grid):
        for t, h in enumerate(row):
            label = f"{h}\n{expected[b][t]:.3g} ms" + ("" if meets[b][t] else " !")
            ax.text(t, b, label, ha="center", va="center", fontsize=8,
                    color="white" if h == heads[0] and len(heads) > 1 else "black")
    ax.set_xticks(range(len(thermal)), thermal, rotation=30, ha="right")
    ax.set_yticks(range(len(battery)), battery)
    ax.set_xlabel(f"thermal state ({lut['thermal']['source']})")
    ax.set_ylabel("battery")
    ax.set_title(f"{lut['bundle']['target']}: head count per state, budget {lut['budget_ms']:g} ms ('!' = none meets it)",
                 fontsize=9)
    fig.colorbar(image, ax=ax, ticks=heads, label="heads")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=120, format="png")
    plt.close(fig)
    return png.getvalue()


def dominated_lines(lut: dict[str, Any]) -> list[str]:
    """Why each dominated head count is never chosen, one line each, naming the candidate that beats it.

    A candidate at least as fast and as accurate with fewer heads means the larger subnetwork is
    undertrained (on a trained HydraViT accuracy rises with heads); one with more heads that measured
    faster means timing noise. Either way the user learns what to do, not only that 12 heads is gone.
    """
    top1 = lut["accuracy_basis"] == "top1"
    lines = []
    for d in sorted(lut["dominated"], key=lambda d: d["heads"]):
        beats = [c for c in lut["candidates"] if c["latency_ms"] <= d["latency_ms"] and c["accuracy"] >= d["accuracy"]]
        faster = [c for c in lut["candidates"] if c["latency_ms"] <= d["latency_ms"]]
        if top1 and beats:
            c = max(beats, key=lambda c: (c["accuracy"], -c["latency_ms"]))
            relation = "<" if c["accuracy"] > d["accuracy"] else "no more than"
            why = ("train longer or with more data" if c["heads"] < d["heads"]
                   else "its latency is likely timing noise; calibrate again")
            lines.append(f"{d['heads']} heads: {d['accuracy']:.1f} % {relation} {c['accuracy']:.1f} % at {c['heads']} heads, "
                         f"which is faster ({c['latency_ms']:.3g} ms against {d['latency_ms']:.3g}); {why}")
        elif faster:  # slower than a candidate with more heads: the timings, not the model
            c = max(faster, key=lambda c: c["heads"])
            lines.append(f"{d['heads']} heads: {d['latency_ms']:.3g} ms, slower than {c['heads']} heads ({c['latency_ms']:.3g} ms), "
                         "which has more; likely timing noise: calibrate again")
        else:
            lines.append(f"{d['heads']} heads ({d['latency_ms']:.3g} ms, {d['accuracy']:.4g})")
    return lines


def markdown(lut: dict[str, Any]) -> str:
    """Candidates, deratings and the grid as markdown, readable in a terminal or on GitHub."""
    thermal, battery, sel = lut["thermal"], lut["battery"], lut["selection"]
    lines = [f"# Lookup table: {lut['bundle']['target']}, budget {lut['budget_ms']:g} ms", "",
             f"Bundle manifest sha256 `{lut['bundle']['manifest_sha256']}`; calibration "
             f"`{lut['calibration']['path']}` ({lut['calibration']['device_id']}), soak: "
             f"{'yes' if lut['calibration']['soak'] else 'no (default deratings)'}.", "",
             f"Candidates (Pareto front, accuracy basis: {lut['accuracy_basis']}):", "",
             "| heads | artefact | latency ms | accuracy |", "|---:|---|---:|---:|"]
    lines += [f"| {c['heads']} | {c['artefact']} | {c['latency_ms']:.3g} | {c['accuracy']:.4g} |" for c in lut["candidates"]]
    if lut["dominated"]:
        lines += ["", "Dominated (never chosen):", "", *(f"- {line}" for line in dominated_lines(lut))]
    lines += ["", "Head count per state (expected ms; `!` where no candidate meets the budget):", "",
              "| battery \\ thermal | " + " | ".join(
                  f"{n} (x{m:.3g}, {b})" for n, m, b in zip(thermal["names"], thermal["derating"], thermal["derating_basis"])) + " |",
              "|---|" + "---:|" * len(thermal["names"])]
    for b, row in enumerate(_heads_grid(lut)):
        budget = lut["budget_ms"] * battery["budget_scale"][b]
        cells = [f"{h} ({sel['expected_ms'][b][t]:.3g}){'' if sel['meets_budget'][b][t] else ' !'}" for t, h in enumerate(row)]
        lines.append(f"| {battery['names'][b]} (≤{budget:.3g} ms) | " + " | ".join(cells) + " |")
    lines += ["", f"Hysteresis: switch up only after {sel['min_dwell_s']:g} s, and only as far as the cell holds "
              f"{thermal['margin']:g} hotter and {battery['margin_pct']:g} % emptier; switch down at once."]
    if thermal.get("headroom"):
        lines += ["", "Thermal headroom: a forecast at or past 1.0 runs as at least SEVERE; one the phone cannot "
                  "give (NaN, an error) is held, then the hottest band (the table names it only because the phone "
                  "forecast during calibration)."]
    return "\n".join(lines) + "\n"
