"""How convert's two gates decide: on paired outcomes and their interval, not on a count of images.

Both gates compare two predictions on the same images: the conversion gate fp32 against the
artefact, the nesting gate a subnetwork's own weight scales against the nested ones. Each image is
right or wrong under each choice, so what carries information is the images on which the two
disagree: ``worse`` (right under the reference only) and ``better`` (right under the candidate
only). The cost is ``(worse - better) / images`` in p.p., with a 95 % interval from Newcombe's
hybrid score method for paired proportions (Newcombe 1998, method 10: Wilson intervals of both
marginal proportions, combined with the pair's correlation), which stays inside [-100, 100] and is
sound for the handful of discordant images a small set has.

The decision:
* the whole interval above the bound: the cost is real at this set's size: fail (keep whole);
* the whole interval at or below it: pass;
* otherwise the images cannot tell (64 random inputs give an interval of about +-5 p.p., 96
  held-out images +-3 p.p., against bounds of 0.3 and 1 p.p.), and the decision falls to the
  continuous measure: the cost the outputs' error predicts. Each image's outputs are fitted as a
  gain times its fp32 logits plus a shift plus noise (a gain or a shift common to every logit
  reorders nothing); taken as independent normal noise of the fitted spread on each logit, the
  noise gives each image a probability of being right (its label's class, or the fp32 top-1
  without labels, ending up the largest logit). Summed over the images this is the expected number
  each choice gets right, a smooth function of every image's error where the count moves in whole
  images. It tends to the fp32 outcome as the noise vanishes, to chance (1 / classes) as it grows,
  and below chance for a negative gain. Without labels the fp32 softmax ``q`` stands in for them:
  an output landing on class c keeps ``q_c / q_top`` of the image.

What the gate cannot weigh it refuses in one line rather than passing: no images, counts or shapes
that do not fit together, labels outside the classes, and NaN or inf logits (a NaN reference is
evidence of nothing; a NaN output is a broken runtime or quantisation, however few images it hits).

Pure numpy and the standard library; ``records.manifest.Evidence`` is what is written.
"""

from __future__ import annotations

import math
import numbers
from typing import NoReturn

import numpy as np

from ..errors import HydraEdgeError
from ..paired import CONFIDENCE, difference_interval
from ..records.manifest import Evidence

METHOD = ("paired outcomes on the same images, 95 % interval by Newcombe's hybrid score method; where the "
          "interval spans the bound, the cost predicted by the logits' error decides")
DECIMALS = 4
BROKEN_FP32 = ("the checkpoint's fp32 subnetwork is broken (NaN or inf weights, or an overflow): check it with "
               "hydra-edge eval, or train it again")
BROKEN_OUTPUT = "a broken runtime or quantisation gives NaN or inf: use another --quant (or another runtime)"


def _refuse(what: str, fix: str) -> NoReturn:
    raise HydraEdgeError(f"gate: {what}: {fix}")


def _counts(**counts: object) -> None:
    """Whole numbers of images >= 0: a slip or a damaged record is one line, not a math domain error."""
    bad = {k: v for k, v in counts.items() if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0}
    if bad:
        _refuse(f"counts {bad}", "give whole numbers of images, 0 or more")


def _no_images() -> NoReturn:
    """0 images are no evidence either way: an interval over nothing spans every bound and would pass."""
    _refuse("no images", "the gate needs at least one held-out image (--eval-limit >= 1, --data with images)")


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        _refuse(f"{what} {value!r}", "give a finite number of p.p.")
    return float(value)


def newcombe_interval(both: int, worse: int, better: int, neither: int,
                      confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of ``p_reference - p_candidate`` (as fractions) from the paired 2x2 table.

    ``both``: right under both choices, ``worse``: reference only, ``better``: candidate only,
    ``neither``: wrong under both.
    """
    _counts(both=both, worse=worse, better=better, neither=neither)
    n = both + worse + better + neither
    if n == 0:
        _no_images()
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < confidence < 1:
        _refuse(f"confidence {confidence!r}", "give the interval's level as a fraction in (0, 1), 0.95 by default")
    return difference_interval(both, worse, better, neither, confidence)


def expected_right(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    """Expected share of images right when each image's outputs are its fp32 logits under
    ``outputs``' error, taken as a gain and independent noise: right is the label's class, or without
    labels the fp32 top-1, weighted by how much the fp32 model preferred the class an output lands on.

    Per image, ``outputs`` is fitted as ``gain * reference + shift + noise`` (least squares over the
    classes): a gain or a shift common to every logit reorders nothing, and the noise is what is left,
    its spread pooled over the images. Images with NaN or infinite outputs count as lost; a NaN or
    infinite ``reference`` is refused (it says nothing of what is right).
    """
    out, ref, labels = _logits(outputs, reference, labels)
    r = ref - ref.mean(-1, keepdims=True)
    power = np.sum(r * r, -1)
    free = max(ref.shape[-1] - 2, 1)  # the fit spends two of the classes' degrees of freedom
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN or inf outputs: lost, below
        o = out - out.mean(-1, keepdims=True)
        gain = np.where(power > 0, np.sum(r * o, -1) / np.where(power > 0, power, 1.0), 0.0)
        variance = np.sum((o - gain[:, None] * r) ** 2, -1) / free
    # One spread for every image, pooled: quantisation noise is the same process on every image, and
    # a few classes give each image's own estimate too little to go on (10 classes: +-25 %).
    finite = np.isfinite(variance) & np.isfinite(gain)
    pooled = math.sqrt(float(variance[finite].mean())) if finite.any() else math.inf
    noise = np.where(finite, pooled, np.nan)
    if labels is not None:
        return float(np.mean(_chunked(ref, labels, gain, noise)))
    # Without labels, the fp32 model's own preference stands in for them: an image whose output
    # lands on class c keeps q_c / q_top of the fp32 top-1's expected rightness (q: the fp32
    # softmax). A confident image counts a flip in full, as agreement does; a near tie, where the
    # fp32 model itself hardly prefers one class, counts it by how little it did.
    order = np.argsort(-ref, axis=-1)[:, :TOP_CLASSES]
    shifted = ref - ref.max(-1, keepdims=True)
    rows = np.arange(len(ref))
    kept = np.zeros(len(ref))
    for rank in range(order.shape[1]):
        classes = order[:, rank]
        kept += np.exp(shifted[rows, classes]) * _chunked(ref, classes, gain, noise)
    return float(np.mean(kept))


def _logits(outputs: object, reference: object,
            labels: object) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``outputs`` and a finite ``reference`` as (images, classes) floats of one shape, at least one
    image and two classes, and ``labels`` (or None) one class index per image."""
    out, ref = _floats(outputs, "outputs"), _floats(reference, "reference")
    if ref.ndim != 2 or out.shape != ref.shape or ref.shape[0] < 1 or ref.shape[1] < 2:
        _refuse(f"logits of shapes {out.shape} (outputs) and {ref.shape} (reference)",
                "give both as (images, classes) for the same images, at least one image and two classes")
    lost = ~np.isfinite(ref).all(-1)
    if lost.any():
        _refuse(f"the fp32 reference logits are NaN or inf on {int(lost.sum())} of {len(ref)} images, evidence of "
                "nothing", BROKEN_FP32)
    if labels is None:
        return out, ref, None
    classes = np.asarray(labels)
    if (classes.shape != ref.shape[:1] or not np.issubdtype(classes.dtype, np.integer)
            or classes.min() < 0 or classes.max() >= ref.shape[1]):
        _refuse(f"labels of shape {classes.shape} and type {classes.dtype} for {ref.shape[0]} images of "
                f"{ref.shape[1]} classes", "give one whole class index in [0, classes) per image")
    return out, ref, classes


def _floats(values: object, what: str) -> np.ndarray:
    try:
        return np.asarray(values, np.float64)
    except (TypeError, ValueError):
        _refuse(f"{what} of type {type(values).__name__}", "give logits as an array of numbers")


CHUNK = 64  # images per block of the quadrature (classes x nodes floats each)
TOP_CLASSES = 8  # without labels, the fp32 model's top classes an output may land on (the rest are out of reach)


def _chunked(ref: np.ndarray, wanted: np.ndarray, gain: np.ndarray, noise: np.ndarray) -> np.ndarray:
    return np.concatenate([_on_top(ref[i:i + CHUNK], wanted[i:i + CHUNK], gain[i:i + CHUNK], noise[i:i + CHUNK])
                           for i in range(0, len(ref), CHUNK)])
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(48)  # for the integral over a standard normal
_WEIGHTS = _WEIGHTS / math.sqrt(2 * math.pi)


def _on_top(ref: np.ndarray, wanted: np.ndarray, gain: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Per image, the probability that class ``wanted`` is the largest of ``gain * ref`` plus
    independent normal noise of standard deviation ``noise`` on every logit: with ``z`` the wanted
    class's own noise, ``E_z[prod_j Phi(gain * gap_j / noise + z)]`` (gap_j: the wanted logit minus
    logit j), by Gauss-Hermite quadrature. Exact 0 or 1 without noise; NaN or inf outputs: 0 (lost)."""
    from scipy.special import log_ndtr

    rows = np.arange(len(ref))
    gap = gain[:, None] * (ref[rows, wanted][:, None] - ref)  # (images, classes); 0 at the wanted class
    others = np.ones_like(gap, bool)
    others[rows, wanted] = False
    out = np.zeros(len(ref))
    exact = (noise == 0) & np.isfinite(gain)
    out[exact] = np.all((gap > 0) | ~others, axis=1)[exact]  # ties go against the wanted class
    noisy = np.isfinite(noise) & np.isfinite(gain) & (noise > 0)
    if noisy.any():
        scaled = gap[noisy] / noise[noisy, None]  # (m, classes)
        logs = log_ndtr(scaled[:, :, None] + _NODES[None, None, :]) * others[noisy][:, :, None]
        out[noisy] = np.exp(logs.sum(axis=1)) @ _WEIGHTS
    return out


def weigh(reference: np.ndarray, candidate: np.ndarray, fp32: np.ndarray, labels: np.ndarray | None,
          bound_pp: float, names: tuple[str, str]) -> Evidence:
    """The gate on logits: ``reference`` and ``candidate`` outputs of the same images (fp32 and an
    artefact; own and nested weight scales), right being the label's class or, without labels,
    ``fp32``'s top-1, and the cost their error against ``fp32`` predicts.

    Outputs with NaN or inf are refused, naming them (``names``: reference's, candidate's): a NaN
    row's arg-max is its first class, so counted it may look right, and a few lost images can hide
    in the interval of a large set or behind a weak reference; a broken output must never pass.
    """
    outcomes = []
    for name, outputs in zip(names, (reference, candidate)):
        out, ref, truth = _logits(outputs, fp32, labels)
        refuse_non_finite(out, name)
        outcomes.append(out.argmax(-1) == (ref.argmax(-1) if truth is None else truth))
    predicted = (expected_right(reference, fp32, labels) - expected_right(candidate, fp32, labels)) * 100
    return judge(*outcomes, predicted, bound_pp)


def refuse_non_finite(outputs: np.ndarray, name: str) -> None:
    """One line naming ``name`` where any image's logits hold NaN or inf: never passed, however few."""
    values = np.asarray(outputs, np.float64)
    lost = ~np.isfinite(values).all(axis=tuple(range(1, values.ndim)))
    if lost.any():
        raise HydraEdgeError(f"{name}: logits NaN or inf on {int(lost.sum())} of {lost.size} images, never "
                             f"passed: {BROKEN_OUTPUT}")


def judge(reference_ok: np.ndarray, candidate_ok: np.ndarray, logit_cost_pp: float, bound_pp: float) -> Evidence:
    """The gate's decision on per-image outcomes (booleans, same images) and the predicted cost."""
    reference_ok, candidate_ok = np.asarray(reference_ok), np.asarray(candidate_ok)
    if reference_ok.ndim != 1 or reference_ok.shape != candidate_ok.shape or not (
            reference_ok.dtype == candidate_ok.dtype == bool):
        _refuse(f"outcomes of shapes {reference_ok.shape} and {candidate_ok.shape} ({reference_ok.dtype}, "
                f"{candidate_ok.dtype})", "give one boolean per image, the same images under both choices")
    return decide(images=len(reference_ok), reference_right=int(reference_ok.sum()),
                  worse=int((reference_ok & ~candidate_ok).sum()), better=int((~reference_ok & candidate_ok).sum()),
                  logit_cost_pp=logit_cost_pp, bound_pp=bound_pp)


def decide(images: int, reference_right: int, worse: int, better: int, logit_cost_pp: float,
           bound_pp: float) -> Evidence:
    """The decision from the counts; ``rejudge`` calls it again when only the bound changed."""
    _counts(images=images, reference_right=reference_right, worse=worse, better=better)
    if images == 0:
        _no_images()
    if worse > reference_right or reference_right + better > images:
        _refuse(f"{worse} images worse and {better} better with {reference_right} of {images} right under the "
                "reference", "the worse are among the reference's right, the better among its wrong")
    bound_pp = _finite(bound_pp, "bound")
    if not -100 <= bound_pp <= 100:
        _refuse(f"bound {bound_pp!r} p.p.", "give the cost allowed in [-100, 100] p.p.")
    logit_cost_pp = round(float(np.clip(_finite(logit_cost_pp, "predicted cost"), -100.0, 100.0)), DECIMALS)
    both = reference_right - worse
    low, high = newcombe_interval(both, worse, better, images - both - worse - better)
    low_pp, high_pp = round(low * 100, DECIMALS), round(high * 100, DECIMALS)
    if low_pp > bound_pp or high_pp <= bound_pp:
        decided_by, passed = "images", high_pp <= bound_pp
    else:
        decided_by, passed = "logits", logit_cost_pp <= bound_pp
    return Evidence(images=images, reference_right=reference_right, worse=worse, better=better,
                    cost_pp=round((worse - better) * 100 / images, DECIMALS), low_pp=low_pp, high_pp=high_pp,
                    logit_cost_pp=logit_cost_pp, bound_pp=bound_pp, decided_by=decided_by, passed=passed)


def rejudge(evidence: Evidence, bound_pp: float) -> Evidence:
    """The same evidence held to another bound (a re-run with another ``--max-drop``)."""
    return decide(evidence.images, evidence.reference_right, evidence.worse, evidence.better,
                  evidence.logit_cost_pp, bound_pp)


def describe(e: Evidence, candidate: str, reference: str) -> str:
    """One phrase a user can check: the cost, its interval, the images, and what decided."""
    text = (f"{e.cost_pp:+.2f} p.p. (95 % interval {e.low_pp:+.2f} to {e.high_pp:+.2f}) on {e.images} images: "
            f"{e.worse} right only under {reference}, {e.better} only under {candidate}")
    if e.decided_by == "logits":
        text += f"; too few images to tell, the logits' error predicts {e.logit_cost_pp:+.2f} p.p."
    return text
