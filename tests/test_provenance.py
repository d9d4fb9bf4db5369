"""Shared node provenance (``convert.provenance``): the same history as torch's deep copy, the same .pte bytes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.fx.traceback import NodeSource, NodeSourceAction

from hydra_edge.convert import executorch, provenance
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT


def _node_with_history() -> torch.fx.Node:
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    older = graph.placeholder("y")
    node.meta["from_node"] = [NodeSource(older, "earlier", NodeSourceAction.CREATE)]
    return node


def test_a_shared_history_reads_as_the_deep_copied_one_and_torch_is_restored() -> None:
    node = _node_with_history()
    copied = NodeSource(node, "pass", NodeSourceAction.REPLACE)
    with provenance.shared_provenance():
        shared = NodeSource(node, "pass", NodeSourceAction.REPLACE)
        fresh = NodeSource(None, "pass")
    assert shared.to_dict() == copied.to_dict() and fresh.from_node == []
    assert shared.from_node[0] is node.meta["from_node"][0]  # shared, not copied
    assert shared.from_node is not node.meta["from_node"]  # a list of its own: appending to the node's leaves it
    assert NodeSource(node, "pass").from_node[0] is not node.meta["from_node"][0]  # torch's deep copy again


@pytest.mark.slow  # lowers a subnetwork to .pte twice
@pytest.mark.parametrize("quant", ["fp32", "int8-dynamic"])
def test_a_pte_is_byte_identical_with_shared_provenance(quant: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    sub = HydraViT(preset("digits", depth=1, heads=(3, 6))).subnetwork(3)
    images = np.random.default_rng(0).standard_normal((8, 1, 8, 8), dtype=np.float32)

    def pte(name: str) -> bytes:
        executorch.export(sub, torch.from_numpy(images[:1]), quant, {}, images, tmp_path / name, lambda stage: None)
        return (tmp_path / name).read_bytes()

    shared = pte("shared.pte")
    monkeypatch.setattr(provenance, "shared_provenance", contextlib.nullcontext)
    assert pte("deep-copied.pte") == shared
