"""Host verification: run an artefact in its own runtime (the device's engine) against eager fp32.

Accuracy is measured on held-out images of the checkpoint's data split; an artefact whose top-1
falls more than ``max_drop`` p.p. (plus one held-out image, the measurement's resolution) below its
fp32 subnetwork fails, naming the file. The golden
pair and its tolerance are chosen here so that a correct runtime on another CPU passes and a
broken one (garbage or mis-dequantised outputs) fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import write_bytes
from ..errors import HydraEdgeError
from ..runtime.engines import Engine, compare
from .golden import npz_bytes


DROP_DECIMALS = 4  # the top-1 drop is recorded to 1e-4 p.p.


@dataclass(frozen=True)
class EvalSet:
    """Images to verify on; ``labels`` is None when only agreement with fp32 can be measured."""

    images: np.ndarray  # (N, C, H, W) float32
    labels: np.ndarray | None  # (N,) int64
    basis: str  # "held-out split of <source>" or "random inputs (agreement only)"


@torch.no_grad()
def eager_logits(model: torch.nn.Module, images: np.ndarray, batch: int = 64) -> np.ndarray:
    """fp32 logits of the eager subnetwork, the reference every artefact is held to."""
    chunks = [model(torch.from_numpy(images[i : i + batch])) for i in range(0, len(images), batch)]
    return torch.cat(chunks).numpy().astype(np.float32)


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(-1) == labels).mean() * 100)


def accuracy(outputs: np.ndarray, reference: np.ndarray, evalset: EvalSet) -> dict[str, Any]:
    """Top-1 of artefact and fp32 (None without labels), their drop, agreement and max |diff|."""
    diff, agree = compare(outputs, reference)
    art = ref = drop = None
    if evalset.labels is not None:
        art, ref = top1(outputs, evalset.labels), top1(reference, evalset.labels)
        drop = round(ref - art, DROP_DECIMALS)
    return {
        "basis": evalset.basis, "images": len(evalset.images), "top1": art, "fp32_top1": ref,
        "drop_pp": drop, "agreement": round(agree * 100, 4), "max_abs_diff": diff,
    }


def allowed_drop(max_drop: float, images: int) -> float:
    """The top-1 drop an artefact may show on ``images`` held-out images: ``max_drop`` p.p. plus one
    image. A drop is counted in whole images, so one image (100 / N p.p.) is the resolution of the
    measurement; with few images one flipped prediction alone would exceed a tight ``max_drop``.
    ``DROP_DECIMALS`` more: the recorded drop is rounded, so exactly one image must still pass."""
    return max_drop + 100.0 / max(images, 1) + 10.0 ** -DROP_DECIMALS


def check_drop(acc: dict[str, Any], max_drop: float, name: str) -> None:
    """Fail, naming the artefact, when its top-1 falls below fp32 by more than ``allowed_drop``."""
    allowed = allowed_drop(max_drop, acc["images"])
    if acc["drop_pp"] is not None and acc["drop_pp"] > allowed:
        raise HydraEdgeError(
            f"{name}: top-1 {acc['top1']:.2f}% is {acc['drop_pp']:.2f} p.p. below the fp32 subnetwork's "
            f"{acc['fp32_top1']:.2f}% (allowed {max_drop:g} p.p. + {100.0 / max(acc['images'], 1):.2f}, one of "
            f"{acc['images']} held-out images); use another --quant, raise --max-drop or --eval-limit"
        )


def golden_tolerance(outputs: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Twice the host's own error (at least 1% of the logit range), and at most one more top-1 flip.

    A device running the same artefact differs from the host only by kernel rounding, far inside
    this; garbage logits miss both bounds.
    """
    diff, agree = compare(outputs, reference)
    n = len(reference)
    scale = float(np.abs(reference).max()) if reference.size else 1.0
    return {
        "max_abs_diff": float(max(2 * diff, 0.01 * scale, 1e-5)),
        "min_top1_agreement": max(0.0, (math.floor(agree * n + 1e-6) - 1) / n),
        "host_max_abs_diff": diff,
        "host_top1_agreement": agree,
    }


def write_golden(path: Path, images: np.ndarray, reference: np.ndarray, outputs: np.ndarray) -> None:
    """``<artefact>.golden.npz``: inputs, fp32 reference logits and this host's artefact logits."""
    write_bytes(path, npz_bytes(inputs=images, reference=reference, outputs=outputs))


def verify(engine: Engine, reference: np.ndarray, evalset: EvalSet, max_drop: float, name: str) -> tuple[dict[str, Any], np.ndarray]:
    """Run the whole evaluation set through ``engine``; returns its accuracy record and outputs."""
    outputs = engine.run(evalset.images)
    acc = accuracy(outputs, reference, evalset)
    check_drop(acc, max_drop, name)
    return acc, outputs
