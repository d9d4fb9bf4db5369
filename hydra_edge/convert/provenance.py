"""torch.fx's node provenance shared between a node and the nodes made from it, not deep-copied at every pass.

Every pass that re-traces a graph (PT2E's prepare and convert, ``to_edge``'s decompositions, each of
ExecuTorch's XNNPACK passes) records, in each new node's ``meta["from_node"]``, a ``NodeSource`` of
the node it came from; torch 2.13 builds it with ``copy.deepcopy`` of that node's whole history.
The history grows by one level per pass, so lowering one subnetwork deep-copied ever longer chains
for every node of every pass: more than half of a ``.pte``'s conversion time on a 2-core host
(docs/benchmarks.md, "Android conversion time"), paid again for every head count.

A ``NodeSource`` is never changed once made (torch, torchao and ExecuTorch only assign its fields
in its constructor and ``_from_dict``), so a new one can hold the old history's sources themselves,
in a list of its own, and read the same: the same debug handles, the same ``.pte`` bytes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def shared_provenance() -> Iterator[None]:
    """Within the block, a new ``NodeSource`` shares its node's history (a shallow copy of the list)."""
    from torch.fx.traceback import NodeSource

    deep_copying = NodeSource.__init__

    def sharing(self: NodeSource, node: Any, pass_name: str = "", action: Any = None) -> None:
        history = node.meta.get("from_node") if node is not None else None
        if history is None:
            deep_copying(self, node, pass_name, action)
            return
        node.meta["from_node"] = []  # torch's own constructor, with nothing to deep-copy
        try:
            deep_copying(self, node, pass_name, action)
        finally:
            node.meta["from_node"] = history
        self.from_node = list(history)

    NodeSource.__init__ = sharing  # type: ignore[method-assign]
    try:
        yield
    finally:
        NodeSource.__init__ = deep_copying  # type: ignore[method-assign]
