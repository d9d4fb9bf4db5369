"""hydra-edge: one HydraViT, ten subnetworks, taken to phones and boards.

The public names are imported lazily so that the device side (``hydra_edge.runtime``) can be
imported on a board that has numpy and a runtime but no torch.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "HydraViT": "hydra_edge.model",
    "HydraConfig": "hydra_edge.config",
    "preset": "hydra_edge.config",
    "HydraEdgeError": "hydra_edge.errors",
    "load_checkpoint": "hydra_edge.checkpoint",
    "init_heads_from": "hydra_edge.checkpoint",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hydra_edge' has no attribute {name!r}")
