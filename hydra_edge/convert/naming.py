"""What an artefact is called and what decides its bytes: its file name says what it is, and its
fingerprint hashes every input, so a re-run skips an artefact exactly when it would come out the same."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from typing import Any

from .. import __version__
from ..formats import FORMATS
from .formats import all_tools, tools
from .targets import Variant


def artefact_name(k: int, variant: Variant) -> str:
    """``vit_h6_executorch_int8-dynamic.pte``: the name says what it is."""
    return f"vit_h{k}_{variant.format}_{variant.quant}{FORMATS[variant.format].suffix}"


def tool_versions(names: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """Installed versions of ``names`` (default: every format's tools), with hydra-edge's own."""
    out: dict[str, str | None] = {"hydra-edge": __version__}
    for name in all_tools() if names is None else names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint(ckpt_sha: str, k: int, variant: Variant, data: dict[str, Any] | None,
                eval_limit: int, golden_inputs: int, weights: str) -> str:
    """Hash of everything that decides an artefact's bytes and its verification record."""
    inputs = {
        "checkpoint": ckpt_sha, "weights": weights, "heads": k, "variant": variant.conversion_dict(), "data": data,
        "eval_limit": eval_limit, "golden_inputs": golden_inputs,
        "tools": tool_versions(tools(variant.format)),
        "quantisation": "nested",  # int8 weights quantised with the largest head count's ranges (convert.nesting)
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
