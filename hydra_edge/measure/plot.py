"""The calibration plot: latency against head count with the bundle's accuracy beside it, and the
device's accuracy/latency Pareto front (the head counts worth switching between).
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_path
from ..records.calibration import Calibration
from ..records.manifest import Manifest
from .pareto import Point, pareto


def accuracy_by_heads(manifest: Manifest) -> tuple[dict[int, float], str]:
    """Top-1 per head count from the manifest, or agreement with fp32 when it has no labels."""
    top1 = {a.heads: a.accuracy.get("top1") for a in manifest.artefacts}
    if all(v is not None for v in top1.values()):
        return {k: float(v) for k, v in top1.items()}, "top-1 (%)"
    agreement = {a.heads: a.accuracy.get("agreement") for a in manifest.artefacts}
    return {k: float(v) for k, v in agreement.items() if v is not None}, "agreement with fp32 (%)"


def plot_calibration(calibration: Calibration, manifest: Manifest, path: str | Path) -> Path:
    """Write the two-panel PNG; head counts that failed or were not timed are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = calibration.measured()
    accuracy, acc_label = accuracy_by_heads(manifest)
    heads = [r.heads for r in measured]
    p50 = [r.latency_ms for r in measured]
    p90 = [r.latency.get("p90_ms") or r.latency_ms for r in measured]  # native runners give means only
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.errorbar(heads, p50, yerr=[[0] * len(p50), [hi - lo for hi, lo in zip(p90, p50)]],
                  marker="o", capsize=3, label="latency p50 (bar to p90)")
    known = [(r.heads, r.p90_interval_ms) for r in measured if r.p90_interval_ms is not None]
    if known:  # timed by rounds: the p90's 95 % interval, whose upper end the table plans with
        left.vlines([h for h, _ in known], [i[0] for _, i in known], [i[1] for _, i in known], color="tab:red",
                    lw=4, alpha=0.5, label="p90 95 % interval")
    left.set(xlabel="heads", ylabel="latency (ms)", title=f"{calibration.device_id}")
    left.set_xticks(heads)
    twin = left.twinx()
    twin.plot(heads, [accuracy.get(k, float("nan")) for k in heads], "s--", color="tab:green", label=acc_label)
    twin.set_ylabel(acc_label)
    left.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)

    points = [Point(r.heads, r.artefact, r.latency_ms, accuracy[r.heads], None) for r in measured if r.heads in accuracy]
    front, _ = pareto(points)
    for p in points:
        right.scatter([p.latency_ms], [p.accuracy], color="tab:red" if p in front else "tab:gray", zorder=3)
        right.annotate(f"h{p.heads}", (p.latency_ms, p.accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
    right.step([p.latency_ms for p in front], [p.accuracy for p in front], where="post", color="tab:red",
               label="Pareto front")
    right.set(xlabel="latency p50 (ms)", ylabel=acc_label, title="accuracy / latency on this device")
    right.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
