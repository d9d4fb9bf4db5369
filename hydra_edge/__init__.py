"""hydra-edge: one HydraViT, ten subnetworks, taken to phones and boards.

The public names are imported lazily so that the device side (``hydra_edge.runtime``) can be
imported on a board that has numpy and a runtime but no torch.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "HydraViT": "hydra_edge.model.hydravit",
    "HydraConfig": "hydra_edge.model.config",
    "preset": "hydra_edge.model.config",
    "HydraEdgeError": "hydra_edge.errors",
    "load_checkpoint": "hydra_edge.model.checkpoint",
    "init_heads_from": "hydra_edge.model.checkpoint",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hydra_edge' has no attribute {name!r}")
