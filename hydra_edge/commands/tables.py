"""The tables ``info``, ``train`` and ``eval`` print: one rich table per result, right-aligned numbers."""

from __future__ import annotations

from ..model.config import HydraConfig


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


def print_accuracy(cfg: HydraConfig, accuracy: dict[int, float], title: str) -> None:
    """Held-out top-1 per head count beside each subnetwork's width and GMACs."""
    from ..train.evaluate import accuracy_rows

    rows = [[str(r["heads"]), str(r["width"]), f"{r['gmacs']:.4f}", f"{r['top1']:.2f}"]
            for r in accuracy_rows(cfg, accuracy)]
    print_table(title, ["heads", "width", "GMACs", "top-1 %"], rows)
