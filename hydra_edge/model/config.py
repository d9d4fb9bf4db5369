"""Model configuration: the config record's fields (``records.config.ModelConfig``, defined once, torch-free)
with the sizes and checks the model needs; presets as data (timm's habit)."""

from __future__ import annotations

from typing import Any, Tuple

import msgspec

from ..errors import HydraEdgeError
from ..records import codec
from ..records.config import ModelConfig


class HydraConfig(ModelConfig, frozen=True):
    """Sizes of a full-width HydraViT; subnetwork k uses the first ``k`` heads.

    Width is ``head_dim * num_heads``; subnetwork k has width ``head_dim * k``. The fields are the
    config record's (what checkpoints and manifests store); ``heads`` is kept sorted and unique, as a
    tuple, so two configs that serve the same head counts are equal.
    """

    heads: Tuple[int, ...] = tuple(range(3, 13))  # head counts trained and served

    def __post_init__(self) -> None:
        if self.img_size % self.patch_size:
            raise HydraEdgeError(
                f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}"
            )
        msgspec.structs.force_setattr(self, "heads", tuple(sorted(set(int(k) for k in self.heads))))
        bad = [k for k in self.heads if not 1 <= k <= self.num_heads]
        if bad or not self.heads:
            raise HydraEdgeError(
                f"head counts {list(self.heads)} must lie in 1..{self.num_heads}; "
                f"pass e.g. --heads 3-{self.num_heads}"
            )

    @property
    def embed_dim(self) -> int:
        return self.head_dim * self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    def width(self, k: int) -> int:
        """Embedding width of subnetwork ``k``."""
        self.check_heads(k)
        return self.head_dim * k

    def check_heads(self, k: int) -> None:
        if not 1 <= k <= self.num_heads:
            raise HydraEdgeError(
                f"head count {k} is out of range: this model has 1..{self.num_heads} heads"
            )

    def narrowed(self, k: int) -> "HydraConfig":
        """The config of subnetwork ``k`` as a full model of its own (a plain ViT of k heads)."""
        self.check_heads(k)
        return msgspec.structs.replace(self, num_heads=k, heads=(k,), separate_heads=False)

    def to_dict(self) -> dict[str, Any]:
        return {**msgspec.structs.asdict(self), "heads": list(self.heads)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "model config") -> "HydraConfig":
        """A config as checkpoints and manifests store it, each field checked (``hydra_edge.records.config``)."""
        checked = codec.convert(d, ModelConfig, where, "is it from a newer hydra-edge, or damaged?")
        return cls(**{**msgspec.structs.asdict(checked), "heads": tuple(checked.heads)})


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's model: ViT-B/16, 224 px, ImageNet-1k; k=3/6/12 have DeiT-tiny/small/base shapes.
    "b16": dict(),
    # Small enough to train on scikit-learn's 8x8 digits in seconds on a CPU: 12 heads of width 8.
    "digits": dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, depth=4, head_dim=8),
    # A folder of the user's own colour photos on a CPU, from scratch in minutes: 64 px RGB, patches
    # of 8 (an 8x8 grid, as b16's 14x14 at a fraction of the cost), six blocks of 12 heads of width 16,
    # so head counts 3-12 are the same fractions of the model as in b16.
    "mini": dict(img_size=64, patch_size=8, depth=6, head_dim=16),
}


def preset(name: str, **overrides: Any) -> HydraConfig:
    """Build a config from a named preset, with keyword overrides."""
    if name not in PRESETS:
        raise HydraEdgeError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return HydraConfig(**{**PRESETS[name], **overrides})


def parse_heads(text: str, num_heads: int) -> tuple[int, ...]:
    """Parse ``"3-12"``, ``"3,6,12"`` or ``"3-6,12"`` into sorted head counts."""
    heads: set[int] = set()
    for part in text.split(","):
        try:
            lo, hi = (int(v) for v in part.split("-", 1)) if "-" in part.strip()[1:] else (int(part),) * 2
        except ValueError:
            raise HydraEdgeError(f"cannot read head counts {text!r}: use a range like 3-12 or a list like 3,6,12") from None
        if not 1 <= lo <= hi <= num_heads:  # checked before expanding: 1-1000000000 must not fill memory
            raise HydraEdgeError(f"head counts {part.strip()!r} out of range: this model has 1..{num_heads} heads; "
                                 f"pass e.g. --heads 3-{num_heads}")
        heads.update(range(lo, hi + 1))
    return tuple(sorted(heads))
