"""hydra-edge: one HydraViT, ten subnetworks, taken to phones and boards."""

from .checkpoint import init_heads_from, load_checkpoint
from .config import HydraConfig, preset
from .errors import HydraEdgeError
from .model import HydraViT

__all__ = ["HydraViT", "HydraConfig", "HydraEdgeError", "load_checkpoint", "init_heads_from", "preset"]
__version__ = "0.1.0"
