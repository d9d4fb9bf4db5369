"""PNG plots of what people would rather look at than JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..atomic import atomic_path


def plot_accuracy(series: Mapping[str, Sequence[dict]], path: str | Path, title: str,
                  history: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """Accuracy against GMACs, one line per series, each point labelled with its head count; beside it,
    given a training ``history``, the held-out accuracy of every head count per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if history else 1, figsize=(12.4 if history else 6.4, 4.2), dpi=120, squeeze=False)
    ax = axes[0][0]
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
    if history:
        _plot_epochs(axes[0][1], history, plt.get_cmap("viridis"))
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def _plot_epochs(ax: Any, history: Sequence[Mapping[str, Any]], colours: Any) -> None:
    """Held-out top-1 per epoch: a solid line per head count, dashed for its EMA weights when kept."""
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    heads = sorted({int(k) for h in history for k in h["val_top1"]})
    for i, k in enumerate(heads):
        colour = colours(i / max(1, len(heads) - 1))
        for entry, style, label in (("val_top1", "-", f"{k} heads"), ("val_top1_ema", "--", None)):
            points = [(e, _at(h.get(entry), k)) for e, h in zip(epochs, history)]
            points = [(e, v) for e, v in points if v is not None]
            if points:
                ax.plot(*zip(*points), style, color=colour, marker=".", label=label)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("held-out top-1 accuracy (%)")
    kept = any(h.get("val_top1_ema") for h in history)
    ax.set_title("per epoch" + (" (dashed: EMA weights)" if kept else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def _at(accuracy: Mapping[Any, float] | None, k: int) -> float | None:
    """Accuracy of head count ``k`` in a history entry, whose keys are ints, or strings once read from JSON."""
    if not accuracy:
        return None
    return accuracy.get(k, accuracy.get(str(k)))
