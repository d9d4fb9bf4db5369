"""Dispatch from a format name (a key of ``runtime.engines.FORMATS``) to its exporter module.

Each exporter module is named after its format and exposes ``QUANTS`` (schemes it implements),
``TOOLS`` (pip packages whose versions decide its output) and ``export(...)``. Importing one is
cheap: the heavy converter is imported inside ``export``.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ..errors import HydraEdgeError
from ..runtime.engines import FORMATS


def exporter(name: str) -> ModuleType:
    """The module ``hydra_edge.convert.<name>`` that converts to format ``name``."""
    if name not in FORMATS:
        raise HydraEdgeError(f"unknown format {name!r}; choose one of {sorted(FORMATS)}")
    return import_module(f"{__package__}.{name}")


def quants(name: str) -> tuple[str, ...]:
    return exporter(name).QUANTS


def tools(name: str) -> tuple[str, ...]:
    return exporter(name).TOOLS
