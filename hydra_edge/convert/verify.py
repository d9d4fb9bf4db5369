"""Host verification: run an artefact in its own runtime (the device's engine) against eager fp32.

Accuracy is measured on held-out images of the checkpoint's data split; an artefact whose top-1
falls more than ``max_drop`` p.p. below its fp32 subnetwork, on the evidence of the images that
tell the two apart (``evidence``: beyond noise at the set's size, or, where the set is too small to
tell, by the drop the logits' error predicts), fails, naming the file and the evidence. The golden
pair and its tolerance are chosen here so that a correct runtime on another CPU passes and a
broken one (garbage or mis-dequantised outputs) fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from ..atomic import write_bytes
from ..errors import HydraEdgeError
from ..records.manifest import Evidence
from ..runtime.engines import Engine, compare
from .evidence import describe, refuse_non_finite, rejudge, weigh
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


def accuracy(outputs: np.ndarray, reference: np.ndarray, evalset: EvalSet, max_drop: float,
             name: str) -> dict[str, Any]:
    """Top-1 of artefact ``name`` and fp32 (None without labels), their drop and how the gate judged it
    against ``max_drop``, agreement and max |diff|."""
    diff, agree = compare(outputs, reference)
    art = ref = drop = evidence = None
    if evalset.labels is None:  # no gate: the golden pair is the check, and NaN would be its tolerance
        refuse_non_finite(outputs, name)
    else:
        labels = evalset.labels
        evidence = msgspec.to_builtins(weigh(reference, outputs, reference, labels, max_drop,
                                             ("the fp32 subnetwork", name)))
        art, ref = top1(outputs, labels), top1(reference, labels)
        drop = round(ref - art, DROP_DECIMALS)
    return {
        "basis": evalset.basis, "images": len(evalset.images), "top1": art, "fp32_top1": ref,
        "drop_pp": drop, "agreement": round(agree * 100, 4), "max_abs_diff": diff, "evidence": evidence,
    }


def within_drop(acc: dict[str, Any], max_drop: float) -> bool:
    """Whether a recorded accuracy passes ``max_drop`` (a re-run may give another bound than the one
    recorded). Records from before the evidence was kept: the drop against ``max_drop`` plus one image."""
    if acc.get("drop_pp") is None:
        return True
    if acc.get("evidence") is not None:
        return rejudge(msgspec.convert(acc["evidence"], Evidence), max_drop).passed
    return acc["drop_pp"] <= max_drop + 100.0 / max(acc.get("images") or 1, 1) + 10.0 ** -DROP_DECIMALS


def check_drop(acc: dict[str, Any], max_drop: float, name: str) -> None:
    """Fail, naming the artefact and the evidence, when the gate judged its drop over ``max_drop``."""
    if acc["evidence"] is None or acc["evidence"]["passed"]:
        return
    e = msgspec.convert(acc["evidence"], Evidence)
    decide = ("more held-out images would decide it (a larger --eval-limit, or --data with more images)"
              if e.decided_by == "logits" else "use another --quant")
    raise HydraEdgeError(
        f"{name}: top-1 {acc['top1']:.2f}% against the fp32 subnetwork's {acc['fp32_top1']:.2f}%, a drop of "
        f"{describe(e, 'the artefact', 'fp32')}; over the allowed {max_drop:g} p.p. ({e.decided_by} decided); "
        f"{decide}, or raise --max-drop"
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
    acc = accuracy(outputs, reference, evalset, max_drop, name)
    check_drop(acc, max_drop, name)
    return acc, outputs
