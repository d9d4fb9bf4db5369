"""How every bench ends: ``<name>.json``, ``.md`` and ``.png`` under one folder, and the table printed.

A bench builds its figure with ``subplots`` (matplotlib without a display) and returns it;
``save_report`` lays it out and writes it atomically beside the JSON and the markdown table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hydra_edge.atomic import atomic_path, write_json, write_text


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots`` on the Agg backend (benches run on headless hosts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_report(out: Path, name: str, report: dict[str, Any], markdown: Callable[[dict[str, Any]], str],
                plot: Callable[[dict[str, Any]], Any]) -> None:
    """``name``.json, .md and .png under ``out``, and the table on the terminal."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", report)
    write_text(out / f"{name}.md", markdown(report))
    fig = plot(report)
    fig.tight_layout()
    with atomic_path(out / f"{name}.png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    print(markdown(report))
