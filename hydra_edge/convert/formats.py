"""The exporter contract (``Exporter``), and dispatch from a format name (a key of
``hydra_edge.formats.FORMATS``) to the exporter module that entry names.

A format's exporter is one module satisfying ``Exporter`` structurally: its constants and two
functions, nothing to register but the table entry. Importing one is cheap: the heavy converter is
imported inside ``export``.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

import numpy as np

from ..errors import HydraEdgeError
from ..formats import FORMATS

if TYPE_CHECKING:  # the exporters import torch inside export() only
    import torch

    from .nesting import Ranges


class Exporter(Protocol):
    """What every exporter module provides (``tests/test_exporters.py`` checks each registered one)."""

    QUANTS: tuple[str, ...]  # quantisation schemes it implements (a target's ``quant`` is checked against them)
    NESTED: tuple[str, ...]  # those it can quantise with the largest head count's weight ranges (convert.nesting)
    TOOLS: tuple[str, ...]  # pip packages whose versions decide its output (hashed into fingerprints)
    IMPORTS: tuple[str, ...]  # modules warmed before timing, so convert_seconds excludes import time

    def export(self, model: torch.nn.Module, example: torch.Tensor, quant: str, options: dict[str, Any],
               calibration: np.ndarray, path: Path, stage: Callable[[str], None],
               ranges: Ranges | None = None) -> dict[str, Any]:
        """Write ``model`` as an artefact to ``path``; returns notes for the manifest."""
        ...

    def tensor_map(self, data: bytes) -> list[Any]:
        """Where each constant's raw bytes lie in an artefact's bytes (for compaction)."""
        ...


def exporter(name: str) -> Exporter:
    """The module that converts to format ``name`` (``FORMATS[name].exporter``)."""
    if name not in FORMATS:
        raise HydraEdgeError(f"unknown format {name!r}; choose one of {sorted(FORMATS)}")
    return cast(Exporter, import_module(FORMATS[name].exporter))


def quants(name: str) -> tuple[str, ...]:
    return exporter(name).QUANTS


def tools(name: str) -> tuple[str, ...]:
    return exporter(name).TOOLS


def all_tools() -> tuple[str, ...]:
    """Every format's tools, once each, in table order: what a manifest records the versions of."""
    return tuple(dict.fromkeys(tool for name in FORMATS for tool in tools(name)))
