"""PNG plots of what people would rather look at than JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ..atomic import atomic_path


def plot_accuracy(series: Mapping[str, Sequence[dict]], path: str | Path, title: str) -> Path:
    """Accuracy against GMACs, one line per series, each point labelled with its head count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for label, rows in series.items():
        xs, ys = [r["gmacs"] for r in rows], [r["top1"] for r in rows]
        ax.plot(xs, ys, marker="o", label=label)
        for r in rows:
            ax.annotate(str(r["heads"]), (r["gmacs"], r["top1"]), textcoords="offset points", xytext=(3, 4), fontsize=7)
    ax.set_xlabel("GMACs per image")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
