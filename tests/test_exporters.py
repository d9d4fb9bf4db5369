"""The exporter contract: every format in the table names a module that provides all of ``Exporter``,
with the same call signatures, so a new format missing a member fails here, not mid-conversion."""

from __future__ import annotations

import inspect

import pytest

from hydra_edge.convert.formats import Exporter, exporter
from hydra_edge.formats import FORMATS

CONSTANTS = [name for name in Exporter.__annotations__]
FUNCTIONS = [name for name, member in vars(Exporter).items() if inspect.isfunction(member) and not name.startswith("_")]


def _call(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    """Parameter names, kinds and defaults: what a caller relies on (annotations are strings here)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_the_protocol_lists_what_the_pipeline_uses() -> None:
    assert CONSTANTS == ["QUANTS", "NESTED", "TOOLS", "IMPORTS"] and FUNCTIONS == ["export", "tensor_map"]


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_registered_exporter_provides_the_whole_protocol(name: str) -> None:
    module = exporter(name)
    for constant in CONSTANTS:
        value = getattr(module, constant, None)
        assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), (name, constant, value)
    assert set(module.NESTED) <= set(module.QUANTS), name
    for function in FUNCTIONS:
        assert callable(getattr(module, function, None)), (name, function)
        wanted = _call(inspect.signature(getattr(Exporter, function)))[1:]  # without self
        assert _call(inspect.signature(getattr(module, function))) == wanted, (name, function)
