"""Nested weight quantisation: subnetwork k's int8 weights and scales are slices of the largest head count's.

Quantised on its own, a subnetwork's weight row is truncated to its first inputs, its range is
usually smaller and its per-row scale differs, so no byte of it is a slice of the 12-head
artefact. Giving each weight quantiser the full model's per-row (min, max), taken over the FULL
row and picked for the subnetwork's rows, makes every scale and every int8 value an exact slice;
the largest head count's artefact is unchanged. Activation quantisation stays per head count.

That costs the small subnetworks a little precision. ``measure`` puts a number on it before
converting: held-out top-1 of the subnetwork with weight-only fake quantisation under both
choices of scales (eager torch; converting twice would double conversion time), and the artefact
is nested unless the cost is over ``max_cost_pp`` on the evidence (``evidence``). docs/one-weight-set.md, "Nested quantisation".
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Mapping, Tuple

import numpy as np
import torch
from torch.func import functional_call

from ..errors import HydraEdgeError
from ..model.slicing import Index, subnetwork_name
from ..records.manifest import Nesting
from .evidence import METHOD, weigh
from .verify import EvalSet, top1

Ranges = Dict[str, Tuple[torch.Tensor, torch.Tensor]]  # weight name -> per-output-row (min, max)

MAX_COST_OPTION = "nest_max_cost_pp"  # target option: p.p. of top-1 nesting may cost at any head count
MAX_COST_PP = 0.3
BASIS = "eager torch, weight-only int8 fake quantisation (per-channel symmetric, the PT2E weight observer's scales)"


def max_cost(options: Mapping[str, Any], where: str = "target") -> float:
    """The target option ``nest_max_cost_pp`` (default 0.3), checked: a number of p.p. in [-100, 100]."""
    value = options.get(MAX_COST_OPTION, MAX_COST_PP)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
        raise HydraEdgeError(f"{where}: option {MAX_COST_OPTION} = {value!r}: give the p.p. of top-1 nesting may "
                             "cost as a number in [-100, 100] (default 0.3) in the profile's [artefacts.options]")
    return float(value)


def quantised_weights(params: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """The weights int8 schemes quantise per output row: linear and convolution weights (``*.weight``, 2-D+)."""
    return {n: p.detach() for n, p in params if n.endswith(".weight") and p.dim() >= 2}


def row_ranges(weights: Mapping[str, torch.Tensor], rows: Callable[[str], Any]) -> Ranges:
    """(min, max) of each weight's output rows over the whole row, then picked with ``rows(name)``.

    Min and max are exact, so these equal what a per-channel MinMax observer finds in the full
    weight, bit for bit, whatever order it reduces in.
    """
    out: Ranges = {}
    for name, w in weights.items():
        lo, hi = torch.aminmax(w.flatten(1), dim=1)
        index = rows(name)
        out[name] = (lo[index].clone(), hi[index].clone())
    return out


def nested_ranges(params: Iterable[Tuple[str, torch.Tensor]], k: int, index: Callable[[str], Index]) -> Ranges:
    """Ranges for subnetwork ``k`` from the full model's parameters and ``index`` (name -> its index for k).

    Only weights subnetwork k shares with the largest head count: a classifier per head count
    (``heads.<k>``) is another tensor, so it keeps its own ranges.
    """
    shared = quantised_weights((n, p) for n, p in params if subnetwork_name(n, k) == n)
    return row_ranges(shared, lambda name: index(name)[0])


def weight_scales(ranges: Ranges) -> Dict[str, torch.Tensor]:
    """Per-row int8 scales from (min, max), computed by the observer both PT2E quantizers configure.

    XNNPACK's and litert-torch's symmetric per-channel configs both use ``PerChannelMinMaxObserver``
    with int8 in [-127, 127] and eps 2**-12; onnxruntime's symmetric int8 (also [-127, 127]) agrees
    except below eps.
    """
    from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver

    scales = {}
    for name, (lo, hi) in ranges.items():
        obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.int8, qscheme=torch.per_channel_symmetric,
                                       quant_min=-127, quant_max=127, eps=2**-12)
        obs.min_val, obs.max_val = lo.clone(), hi.clone()
        scales[name] = obs.calculate_qparams()[0]
    return scales


@torch.no_grad()
def fake_quant_logits(model: torch.nn.Module, scales: Mapping[str, torch.Tensor], images: np.ndarray,
                      batch: int = 64) -> np.ndarray:
    """Logits of ``model`` with its weights ``scales`` names fake-quantised to int8 with those scales."""
    params = dict(model.named_parameters())
    for name, s in scales.items():
        zero = torch.zeros(len(s), dtype=torch.int32)
        params[name] = torch.fake_quantize_per_channel_affine(params[name], s.float(), zero, 0, -127, 127)
    chunks = [functional_call(model, params, (torch.from_numpy(images[i:i + batch]),))
              for i in range(0, len(images), batch)]
    return torch.cat(chunks).numpy()


def both_scales(sub: torch.nn.Module, nested: Ranges) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-row weight scales of ``sub`` quantised on its own and nested; weights without a nested
    range (a classifier per head count) keep their own in both."""
    own = row_ranges(quantised_weights(sub.named_parameters()), lambda name: slice(None))
    own_scales = weight_scales(own)
    return own_scales, {**own_scales, **weight_scales({n: r for n, r in nested.items() if n in own})}


def measure(sub: torch.nn.Module, nested: Ranges, evalset: EvalSet, reference: np.ndarray,
            max_cost_pp: float) -> Nesting:
    """Held-out top-1 of ``sub`` with nested vs its own weight scales, and whether to nest (``decide``)."""
    own_scales, nested_scales = both_scales(sub, nested)
    per_logits = fake_quant_logits(sub, own_scales, evalset.images)
    same = all(torch.equal(own_scales[n], nested_scales[n]) for n in own_scales)
    nested_logits = per_logits if same else fake_quant_logits(sub, nested_scales, evalset.images)
    return decide(per_logits, nested_logits, reference, evalset.labels, max_cost_pp)


def decide(per_logits: np.ndarray, nested_logits: np.ndarray, reference: np.ndarray, labels: np.ndarray | None,
           max_cost_pp: float) -> Nesting:
    """Whether to nest, from the logits under both choices of scales and the fp32 ``reference``.

    Without labels the outcome is agreement with the fp32 subnetwork's top-1. The decision is the
    gate's (``evidence``): own scales the reference, nested ones the candidate, nested unless the
    cost is over ``max_cost_pp`` beyond noise or, where the images cannot tell (the usual case: 64
    random inputs cannot tell 0.3 p.p. from 5), unless the cost the logits' error predicts is.
    The logits' SQNR against fp32 under both choices is recorded either way.
    """
    evidence = weigh(per_logits, nested_logits, reference, labels, max_cost_pp,
                     ("own weight scales", "nested weight scales"))
    logits = {"nested": nested_logits, "per": per_logits}
    agree = {key: round(float((out.argmax(-1) == reference.argmax(-1)).mean() * 100), 4) for key, out in logits.items()}
    acc = {key: None if labels is None else round(top1(out, labels), 4) for key, out in logits.items()}
    unit = "top-1" if labels is not None else "agreement with fp32"
    return Nesting(
        nested=evidence.passed, basis=f"{BASIS}; cost in {unit}; {METHOD}", images=len(reference),
        top1_nested=acc["nested"], top1_per_subnetwork=acc["per"],
        agreement_nested=agree["nested"], agreement_per_subnetwork=agree["per"], cost_pp=evidence.cost_pp,
        max_cost_pp=max_cost_pp, sqnr_db_nested=sqnr_db(nested_logits, reference),
        sqnr_db_per_subnetwork=sqnr_db(per_logits, reference), evidence=evidence,
    )


def sqnr_db(out: np.ndarray, reference: np.ndarray) -> float | None:
    """Signal-to-quantisation-noise ratio of ``out`` against the fp32 ``reference`` logits, in dB
    (None when they are equal: no noise to measure)."""
    out, reference = np.asarray(out, np.float64), np.asarray(reference, np.float64)
    noise = float(np.sum((out - reference) ** 2))
    return None if noise == 0 else round(float(10 * np.log10(np.sum(reference ** 2) / noise)), 3)
