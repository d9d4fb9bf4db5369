"""Analytic size and cost of each subnetwork: parameters, multiply-accumulates, bytes."""

from __future__ import annotations

from dataclasses import dataclass

from .config import HydraConfig

MIB = 2**20


@dataclass(frozen=True)
class SubnetSize:
    heads: int
    width: int
    params: int
    macs: int  # the model's, for one image
    # what an exported artefact computes: its last block for the class token alone (convert.rewrites)
    exported_macs: int

    @property
    def gmacs(self) -> float:
        return self.macs / 1e9

    @property
    def fp32_mib(self) -> float:
        return 4 * self.params / MIB

    @property
    def int8_mib(self) -> float:
        return self.params / MIB



def subnet_size(cfg: HydraConfig, k: int) -> SubnetSize:
    """Parameters and MACs of subnetwork k for one image (b16: params = 144p^2 + 2125p + 1000)."""
    p = cfg.width(k)
    h = cfg.mlp_ratio * p
    n = cfg.num_patches + 1  # tokens, cls included
    patch_in = cfg.in_chans * cfg.patch_size**2
    block_params = (3 * p * p + 3 * p) + (p * p + p) + (h * p + h) + (p * h + p) + 4 * p  # qkv, proj, mlp, 2 norms
    params = (
        patch_in * p + p  # patch embedding
        + p + n * p  # cls token, position embedding
        + cfg.depth * block_params
        + 2 * p  # final norm
        + cfg.num_classes * p + cfg.num_classes  # classifier
    )
    block_macs = n * (3 * p * p + p * p + 2 * h * p) + 2 * n * n * p  # linears + q@k^T + attn@v
    macs = cfg.num_patches * patch_in * p + cfg.depth * block_macs + cfg.num_classes * p
    # the last block: keys and values (and the unused queries) of every token, one token's attention,
    # projection and MLP
    last_block = n * 3 * p * p + 2 * n * p + p * p + 2 * h * p
    return SubnetSize(heads=k, width=p, params=params, macs=macs, exported_macs=macs - block_macs + last_block)


def size_table(cfg: HydraConfig) -> list[SubnetSize]:
    """Every served head count's size, smallest first."""
    return [subnet_size(cfg, k) for k in cfg.heads]
