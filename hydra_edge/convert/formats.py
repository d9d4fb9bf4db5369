"""Dispatch from a format name (a key of ``runtime.engines.FORMATS``) to the exporter module it names.

Each exporter module exposes ``QUANTS`` (schemes it implements), ``NESTED`` (those it can quantise
with the largest head count's weight ranges), ``TOOLS`` (pip packages whose versions decide its
output), ``export(...)`` and ``tensor_map(...)``. Importing one is cheap: the heavy converter is
imported inside ``export``.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ..errors import HydraEdgeError
from ..runtime.engines import FORMATS


def exporter(name: str) -> ModuleType:
    """The module that converts to format ``name`` (``FORMATS[name].exporter``)."""
    if name not in FORMATS:
        raise HydraEdgeError(f"unknown format {name!r}; choose one of {sorted(FORMATS)}")
    return import_module(FORMATS[name].exporter)


def quants(name: str) -> tuple[str, ...]:
    return exporter(name).QUANTS


def tools(name: str) -> tuple[str, ...]:
    return exporter(name).TOOLS


def all_tools() -> tuple[str, ...]:
    """Every format's tools, once each, in table order: what a manifest records the versions of."""
    return tuple(dict.fromkeys(tool for name in FORMATS for tool in tools(name)))
