"""convert's gates decide on paired evidence: a two-image swing is not a drop, a broken artefact still fails."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_edge.convert import nesting
from hydra_edge.convert.evidence import (TOP_CLASSES, decide, expected_right, judge, newcombe_interval, rejudge,
                                         weigh)
from hydra_edge.convert.nesting import both_scales, nested_ranges
from hydra_edge.convert.verify import EvalSet, eager_logits, verify, within_drop
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.slicing import weight_index
from hydra_edge.runtime.engines import Engine
from hydra_edge.train.data import as_arrays, load_data
from hydra_edge.train.loop import TrainSettings, train


@pytest.mark.parametrize("n, p_worse, p_better, p_both", [(96, 0.03, 0.01, 0.5), (64, 0.05, 0.0, 0.9),
                                                          (360, 0.02, 0.02, 0.45), (1000, 0.10, 0.02, 0.3)])
def test_the_interval_covers_the_true_cost_at_its_level(n: int, p_worse: float, p_better: float, p_both: float) -> None:
    """Drawn 2,000 times from known paired probabilities, the 95 % interval holds the true cost at least
    94 % of the time (with Newcombe's continuity correction; without it, 92 % at 96 images)."""
    rng = np.random.default_rng(0)
    cells = rng.multinomial(n, [p_both, p_worse, p_better, 1 - p_both - p_worse - p_better], size=2000)
    truth = p_worse - p_better
    covered = [lo <= truth <= hi for lo, hi in (newcombe_interval(*map(int, c)) for c in cells)]
    assert 0.94 <= np.mean(covered)


def test_the_interval_narrows_with_images_and_never_leaves_the_scale() -> None:
    wide, narrow = newcombe_interval(90, 2, 0, 4), newcombe_interval(900, 20, 0, 40)
    assert wide[0] < 0 < 0.02 < wide[1] and 0 < narrow[0] < 0.02 < narrow[1] < wide[1]
    all_worse, all_better = newcombe_interval(0, 64, 0, 0), newcombe_interval(0, 0, 64, 0)
    assert 0.9 < all_worse[0] < all_worse[1] == 1.0 and -1.0 == all_better[0] < all_better[1] < -0.9


def test_two_images_in_96_is_not_evidence_of_a_drop() -> None:
    """The issue's case: 53.1 -> 51.0 % on 96 held-out images, 2 images behind, a healthy int8 error."""
    unclear = decide(images=96, reference_right=51, worse=2, better=0, logit_cost_pp=0.4, bound_pp=1.0)
    assert (unclear.decided_by, unclear.passed, unclear.cost_pp) == ("logits", True, round(200 / 96, 4))
    assert unclear.low_pp < 1.0 < unclear.high_pp
    # the same count with an error that predicts a real drop fails, and so does a drop beyond noise
    assert not decide(96, 51, 2, 0, logit_cost_pp=3.0, bound_pp=1.0).passed
    clear = decide(96, 51, 12, 0, logit_cost_pp=0.4, bound_pp=1.0)
    assert (clear.decided_by, clear.passed) == ("images", False) and clear.low_pp > 1.0
    # enough images decide on their own, whatever the logits predict
    assert (decide(10_000, 5000, 3, 2, logit_cost_pp=50.0, bound_pp=1.0).decided_by, True) == ("images", True)
    assert rejudge(unclear, 0.3).passed is False and rejudge(unclear, 0.3).bound_pp == 0.3


def test_the_predicted_cost_follows_the_error_and_counts_broken_outputs_as_lost() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((500, 10)) * 3
    small, large = (reference + rng.standard_normal(reference.shape) * s for s in (0.05, 1.0))
    exact = expected_right(reference, reference, None)
    assert exact == 1.0 and 1.0 > expected_right(small, reference, None) > expected_right(large, reference, None) > 0.5
    garbage = reference + rng.standard_normal(reference.shape) * 1e4
    labels = rng.integers(0, 10, 500)
    assert expected_right(garbage, reference, labels) == pytest.approx(0.1, abs=0.03)  # chance: one of 10 classes
    # without labels an output that lands anywhere keeps what the fp32 model thought of that class:
    # on average over the 8 classes it preferred most, q_c / q_top, each with chance 1 / 10
    preference = np.exp(reference - reference.max(-1, keepdims=True))
    expected = (np.sort(preference, -1)[:, ::-1][:, :8].sum(-1) / 10).mean()
    assert expected_right(garbage, reference, None) == pytest.approx(expected, rel=0.15)
    # a shift or gain common to every logit moves no arg-max; a reversed order loses every image
    assert expected_right(reference * 10 + 5.0, reference, None) == pytest.approx(1.0)
    assert expected_right(-reference, reference, None) == 0.0
    assert expected_right(reference, reference, labels) == pytest.approx((reference.argmax(-1) == labels).mean())
    broken = reference.copy()
    broken[:100] = np.nan
    assert expected_right(broken, reference, None) == pytest.approx(0.8)


def _with_noise(reference: np.ndarray, gains: np.ndarray, spread: float, rng: np.random.Generator) -> np.ndarray:
    """Outputs whose fit is known exactly: per image ``gains`` times the reference, a shift, and noise
    orthogonal to both with a sum of squares of ``spread**2 * (classes - 2)``, so the spread the gate
    fits (over the classes' degrees of freedom left after the gain and the shift) is ``spread``."""
    centred = reference - reference.mean(-1, keepdims=True)
    noise = rng.standard_normal(reference.shape)
    noise -= noise.mean(-1, keepdims=True)
    noise -= (np.sum(noise * centred, -1) / np.sum(centred * centred, -1))[:, None] * centred
    noise *= spread * math.sqrt(reference.shape[1] - 2) / np.linalg.norm(noise, axis=-1, keepdims=True)
    return gains[:, None] * reference + 1.5 + noise


def _simulated(reference: np.ndarray, gains: np.ndarray, spread: float, labels: np.ndarray | None,
               draws: int, rng: np.random.Generator) -> float:
    """The gate's noise model run forward: ``draws`` times per image, gain times the reference plus
    independent normal noise of ``spread`` on each logit; the share whose top-1 is the label, or
    without labels the fp32 preference ``q_c / q_top`` of the class it lands on (among the top classes)."""
    noisy = gains[:, None, None] * reference[:, None, :] + rng.standard_normal((*reference.shape[:1], draws,
                                                                                 reference.shape[1])) * spread
    landed = noisy.argmax(-1)
    if labels is not None:
        return float((landed == labels[:, None]).mean())
    preference = np.exp(reference - reference.max(-1, keepdims=True))
    top = np.argsort(-reference, -1)[:, :TOP_CLASSES]
    reach = np.zeros_like(preference)
    np.put_along_axis(reach, top, np.take_along_axis(preference, top, -1), -1)
    return float(np.take_along_axis(reach, landed, -1).mean())


@pytest.mark.parametrize("classes, spread", [(3, 1.0), (10, 1.5), (32, 2.0)])
@pytest.mark.parametrize("labelled", [True, False], ids=["labels", "fp32 top-1"])
def test_the_predicted_share_right_is_what_its_noise_gives_when_simulated(classes: int, spread: float,
                                                                           labelled: bool) -> None:
    """``expected_right`` against 2,000 draws per image of the noise it assumes, to within 0.004 (five
    of the simulation's standard errors): dividing the fitted variance by ``classes`` instead of
    ``classes - 2`` narrows the spread and is 0.007 to 0.04 too lenient here."""
    rng = np.random.default_rng(classes)
    reference = rng.standard_normal((120, classes)) * 3
    gains = rng.uniform(0.3, 2.0, len(reference))
    order = np.argsort(-reference, -1)  # labels: the fp32 top-1 mostly, else its runner-up
    labels = np.where(rng.random(len(reference)) < 0.6, order[:, 0], order[:, 1]) if labelled else None
    outputs = _with_noise(reference, gains, spread, rng)
    simulated = _simulated(reference, gains, spread, labels, 2000, rng)
    assert expected_right(outputs, reference, labels) == pytest.approx(simulated, abs=0.004)


def _refused(call: Callable[[], object]) -> str:
    """The one line a gate gives a bad argument: a HydraEdgeError, never a pass nor numpy's or math's error."""
    with pytest.raises(HydraEdgeError) as err:
        call()
    message = str(err.value)
    assert message and "\n" not in message
    return message


LOGITS = np.random.default_rng(0).standard_normal((8, 10))
LABELS = np.arange(8)
BAD_ARGUMENTS: dict[str, Callable[[], object]] = {
    "no images": lambda: decide(0, 0, 0, 0, logit_cost_pp=0.0, bound_pp=1.0),
    "an empty table": lambda: newcombe_interval(0, 0, 0, 0),
    "a negative count": lambda: newcombe_interval(5, -1, 0, 3),
    "a fractional count": lambda: newcombe_interval(5, 1.5, 0, 3),
    "worse over the reference's right": lambda: decide(10, 5, 6, 0, 0.0, 1.0),
    "better over the reference's wrong": lambda: decide(10, 5, 0, 6, 0.0, 1.0),
    "a NaN bound": lambda: decide(96, 51, 2, 0, 0.4, math.nan),
    "a bound off the scale": lambda: decide(96, 51, 2, 0, 0.4, 101.0),
    "a NaN predicted cost": lambda: decide(96, 51, 2, 0, math.nan, 1.0),
    "outcomes of two lengths": lambda: judge(np.ones(4, bool), np.ones(5, bool), 0.0, 1.0),
    "no outcomes": lambda: judge(np.ones(0, bool), np.ones(0, bool), 0.0, 1.0),
    "outputs of another shape": lambda: expected_right(LOGITS[:, :9], LOGITS, LABELS),
    "one class": lambda: expected_right(LOGITS[:, :1], LOGITS[:, :1], None),
    "no image's logits": lambda: expected_right(LOGITS[:0], LOGITS[:0], None),
    "a label out of range": lambda: expected_right(LOGITS, LOGITS, LABELS + 3),
    "a negative label": lambda: expected_right(LOGITS, LOGITS, LABELS - 1),
    "labels of another length": lambda: expected_right(LOGITS, LOGITS, LABELS[:5]),
    "fractional labels": lambda: expected_right(LOGITS, LOGITS, LABELS + 0.5),
}


@pytest.mark.parametrize("call", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_a_bad_argument_to_the_gate_is_one_line(call: Callable[[], object]) -> None:
    """The issue's cases: 0 images passed (the logits decided, cost 0); mismatched shapes, labels out
    of range and counts that do not add up were numpy's or math's errors, or a decision."""
    _refused(call)


def _verify(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, max_drop: float) -> dict:
    """The conversion gate on an artefact whose engine answers image i (its pixels all i) with ``outputs[i]``."""
    engine = Engine(path=Path("vit_h3.tflite"), format="tflite", threads=1,
                    step=lambda x: outputs[int(x.flat[0])][None])
    n = len(reference)
    images = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None, None], (n, 1, 2, 2))
    return verify(engine, reference, EvalSet(images.copy(), labels, "held-out"), max_drop, "vit_h3.tflite")[0]


def test_a_nan_reference_is_evidence_of_nothing_and_never_passes() -> None:
    """The issue's case: an all-NaN fp32 reference with an all-NaN artefact passed. The reference's
    NaN is refused at both gates, all of it or one image of it, saying so."""
    labels = np.arange(96) % 10
    nan = np.full((96, 10), np.nan, np.float32)
    message = _refused(lambda: _verify(nan, nan, labels, 1.0))
    assert "fp32" in message and "NaN" in message
    reference = np.eye(10, dtype=np.float32)[labels] * 5
    reference[7, 3] = np.inf
    for truth in (labels, None):
        assert "NaN or inf on 1 of 96" in _refused(lambda: nesting.decide(reference, reference, reference, truth, 0.3))


def test_an_artefact_with_a_nan_output_never_passes() -> None:
    """A NaN row's arg-max is 0: an image of class 0 was counted right, and one lost image in 96 passed
    2 p.p. A non-finite output is a broken runtime or quantisation, refused at either gate however few,
    and without labels too, where the golden pair would have recorded a NaN tolerance."""
    labels = np.arange(96) % 10
    reference = np.eye(10, dtype=np.float32)[labels] * 5
    broken = reference.copy()
    broken[0] = np.nan  # label 0
    for truth in (labels, None):
        message = _refused(lambda: _verify(broken, reference, truth, 2.0))
        assert message.startswith("vit_h3.tflite: ") and "NaN or inf on 1 of 96" in message
    for truth in (labels, None):
        assert "nested" in _refused(lambda: nesting.decide(reference, broken, reference, truth, 2.0))


def test_a_zero_cost_passes_a_bound_of_zero_at_either_decision() -> None:
    """``--max-drop 0`` is accepted, so an artefact identical to fp32 (cost exactly 0) must pass it where
    the logits decide (0 <= 0) at both gates; an interval ending exactly at the bound passes on the
    images, and one starting exactly at it is not beyond it, so the logits decide."""
    labels = np.arange(96) % 10
    reference = np.random.default_rng(0).standard_normal((96, 10)).astype(np.float32)
    acc = _verify(reference, reference, labels, 0.0)
    e = acc["evidence"]
    assert (e["decided_by"], e["logit_cost_pp"], e["passed"]) == ("logits", 0.0, True) and within_drop(acc, 0.0)
    assert all(nesting.decide(reference, reference, reference, truth, 0.0).nested for truth in (labels, None))
    gained = decide(96, 40, 0, 20, logit_cost_pp=50.0, bound_pp=0.0)  # the interval wholly below 0
    at_high = rejudge(gained, gained.high_pp)
    assert gained.high_pp < 0 and (at_high.decided_by, at_high.passed) == ("images", True)
    lost = decide(96, 60, 20, 0, logit_cost_pp=-50.0, bound_pp=0.0)  # wholly above 0
    at_low = rejudge(lost, lost.low_pp)
    assert lost.low_pp > 0 and (at_low.decided_by, at_low.passed) == ("logits", True)


FAST_EXAMPLES, SLOW_EXAMPLES = 200, 3000  # per generated test: the fast tier's few seconds, the slow tier's minute
GENERATED: list[tuple[str, st.SearchStrategy, Callable]] = []  # each generated test, run again by the slow tier


def generated(strategy: st.SearchStrategy) -> Callable[[Callable], Callable]:
    """A generated test over ``strategy`` in the fast tier, kept for the slow tier's many more examples."""
    def register(test: Callable) -> Callable:
        GENERATED.append((test.__name__, strategy, test))
        return settings(max_examples=FAST_EXAMPLES, deadline=None)(given(strategy)(test))
    return register


NAMES = ("the reference", "the candidate")


@st.composite
def gate_cases(draw: st.DrawFn) -> dict:
    """Valid logits for ``weigh``: the fp32 logits (scaled, with ties or flat rows at times), a reference
    choice (fp32 itself, or fp32 under a small error) and a candidate under any error: a gain (reversed
    or nothing at all), a shift, noise from none to garbage; labels or none; a bound on the scale."""
    images, classes = draw(st.integers(1, 40)), draw(st.integers(2, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fp32 = rng.standard_normal((images, classes)) * draw(st.sampled_from([1e-3, 1.0, 30.0]))
    if draw(st.booleans()):
        fp32 = np.round(fp32)  # ties, and rows all one value
    own = fp32 + rng.standard_normal(fp32.shape) * draw(st.sampled_from([0.0, 1e-3, 0.1]))
    noise = draw(st.sampled_from([0.0, 1e-4, 0.3, 3.0, 1e3]))
    candidate = fp32 * draw(st.sampled_from([1.0, 0.5, 0.0, -1.0])) + 2.0 + rng.standard_normal(fp32.shape) * noise
    return {"reference": own if draw(st.booleans()) else fp32, "candidate": candidate, "fp32": fp32,
            "labels": rng.integers(0, classes, images) if draw(st.booleans()) else None,
            "bound_pp": draw(st.floats(-100, 100))}


@generated(gate_cases())
def test_any_valid_evidence_is_on_the_scale_with_its_cost_inside_its_interval(case: dict) -> None:
    """Whatever the logits: no error, every figure in [-100, 100] p.p., the point estimate inside its
    interval, the images deciding only where the interval lies on one side of the bound, and a looser
    bound never failing what a stricter one passed."""
    e = weigh(**case, names=NAMES)
    assert all(-100 <= v <= 100 for v in (e.cost_pp, e.low_pp, e.high_pp, e.logit_cost_pp))
    assert e.low_pp <= e.cost_pp <= e.high_pp
    assert (e.decided_by == "images") == (e.low_pp > e.bound_pp or e.high_pp <= e.bound_pp)
    looser = rejudge(e, min(100.0, e.bound_pp + 1.0))
    assert looser.passed or not e.passed


@generated(gate_cases())
def test_a_candidate_identical_to_its_reference_passes_any_bound_from_zero(case: dict) -> None:
    e = weigh(case["reference"], case["reference"], case["fp32"], case["labels"], abs(case["bound_pp"]), NAMES)
    assert e.passed and e.worse == e.better == 0 and e.logit_cost_pp == 0


@generated(st.integers(30, 10**6).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(-(-n // 2), n), st.floats(0, 5), st.floats(-100, 100))))
def test_a_candidate_losing_every_image_its_reference_got_right_fails(case: tuple[int, int, float, float]) -> None:
    """At least half the images lost on 30 or more images fails a bound up to 5 p.p., whatever the logits say."""
    images, right, bound, logit_cost = case
    e = decide(images, right, worse=right, better=0, logit_cost_pp=logit_cost, bound_pp=bound)
    assert (e.decided_by, e.passed) == ("images", False)


def _spoiled(case: dict, rng: np.random.Generator) -> list[Callable[[], object]]:
    """Ways to get a valid case wrong, each a call the gate must refuse."""
    fp32, labels, images, classes = case["fp32"], case["labels"], *case["fp32"].shape
    truth = rng.integers(0, classes, images) if labels is None else labels
    nan = fp32.copy()
    nan[rng.integers(images), rng.integers(classes)] = rng.choice([np.nan, np.inf, -np.inf])
    out_of_range = truth.copy()
    out_of_range[rng.integers(images)] = rng.choice([-1, classes, classes + 1000])

    def gate(reference: np.ndarray = case["reference"], candidate: np.ndarray = case["candidate"],
             fp32: np.ndarray = fp32, labels: np.ndarray | None = labels) -> Callable[[], object]:
        return functools.partial(weigh, reference, candidate, fp32, labels, abs(case["bound_pp"]), NAMES)

    return [gate(fp32=nan), gate(candidate=nan), gate(reference=nan),
            gate(candidate=case["candidate"][:, :-1]), gate(candidate=case["candidate"][:-1]),
            gate(candidate=case["candidate"][0]), gate(fp32[:0], fp32[:0], fp32[:0], None),
            gate(fp32[:, :1], fp32[:, :1], fp32[:, :1], None),
            gate(labels=out_of_range), gate(labels=truth[:-1]), gate(labels=truth + 0.5),
            functools.partial(judge, np.ones(images, bool), np.ones(images + 1, bool), 0.0, 0.0),
            functools.partial(decide, images, images, 0, 0, 0.0, rng.choice([np.nan, np.inf, 100.5, -101.0]))]


@st.composite
def bad_counts(draw: st.DrawFn) -> Callable[[], object]:
    """Counts that cannot be a paired table: a negative, none at all, or more images than there are."""
    cells = draw(st.lists(st.integers(0, 10**6), min_size=4, max_size=4))
    kind = draw(st.sampled_from(["negative", "empty", "worse", "better", "no images"]))
    if kind == "negative":
        cells[draw(st.integers(0, 3))] = draw(st.integers(-10**6, -1))
        return functools.partial(newcombe_interval, *cells)
    if kind == "empty":
        return functools.partial(newcombe_interval, 0, 0, 0, 0)
    images, right = sum(cells), cells[0] + cells[1]
    if kind == "worse":
        return functools.partial(decide, images, right, right + draw(st.integers(1, 10)), 0, 0.0, 1.0)
    if kind == "better":
        return functools.partial(decide, images, right, 0, images - right + draw(st.integers(1, 10)), 0.0, 1.0)
    return functools.partial(decide, 0, 0, 0, 0, draw(st.floats(-100, 100)), draw(st.floats(0, 100)))


@generated(st.one_of(bad_counts(), st.tuples(gate_cases(), st.integers(0, 2**32 - 1)).flatmap(
    lambda c: st.sampled_from(_spoiled(c[0], np.random.default_rng(c[1]))))))
def test_a_bad_argument_is_always_one_line_never_a_numpy_or_math_error(call: Callable[[], object]) -> None:
    _refused(call)


def test_a_manifest_from_before_the_evidence_is_judged_to_within_one_image() -> None:
    """Records written before the gate kept its evidence are re-judged as they were made: the drop
    against the bound plus one held-out image; records with evidence by the evidence."""
    old = {"drop_pp": 4.0, "images": 32}
    assert within_drop(old, 1.0) and not within_drop({**old, "drop_pp": 6.25}, 1.0)
    assert within_drop({"drop_pp": None, "images": 8}, 0.0)  # no labels: nothing to lose
    new = {"drop_pp": 2.0833, "images": 96,
           "evidence": msgspec.to_builtins(decide(96, 51, 2, 0, logit_cost_pp=0.4, bound_pp=1.0))}
    assert within_drop(new, 1.0) and within_drop(new, 0.5) and not within_drop(new, 0.3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[HydraViT, np.ndarray, np.ndarray]:
    """A depth-1 digits model trained a few epochs, and 96 of its held-out images."""
    from hydra_edge.model.checkpoint import load_checkpoint

    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 12)))
    data = load_data("digits", model.config)
    ckpt = train(model, data, TrainSettings(epochs=6, batch_size=64, warmup_epochs=1),
                 tmp_path_factory.mktemp("trained")).checkpoint
    images, labels = as_arrays(data.val, 96)
    return load_checkpoint(ckpt), images, labels


def _engine(module: torch.nn.Module, weights: dict[str, torch.Tensor] | None = None) -> Engine:
    @torch.no_grad()
    def step(x: np.ndarray) -> np.ndarray:
        return torch.func.functional_call(module, {**dict(module.named_parameters()), **(weights or {})},
                                          (torch.from_numpy(x),)).numpy()

    return Engine(path=Path("sub.tflite"), format="tflite", threads=1, step=step)


@pytest.mark.slow  # trains a small model
def test_a_healthy_int8_subnetwork_on_96_images_passes_and_a_layer_10x_off_fails(trained) -> None:
    model, images, labels = trained
    evalset = EvalSet(images, labels, "held-out split of 'digits'")
    sub = model.subnetwork(3)
    reference = eager_logits(sub, images)
    own, _ = both_scales(sub, nested_ranges(model.named_parameters(), 3,
                                            functools.partial(weight_index, cfg=model.config, k=3)))
    int8 = {n: torch.from_numpy(w) for n, w in _fake_quant_weights(sub, own).items()}
    acc, _ = verify(_engine(sub, int8), reference, evalset, 1.0, "vit_h3.tflite")
    e = acc["evidence"]
    assert e["passed"] and e["images"] == 96 and acc["drop_pp"] == e["cost_pp"]
    assert within_drop(acc, 1.0)

    scaled = {"patch_embed.proj.weight": dict(sub.named_parameters())["patch_embed.proj.weight"].detach() * 10}
    with pytest.raises(HydraEdgeError) as err:
        verify(_engine(sub, scaled), reference, evalset, 1.0, "vit_h3.tflite")
    message = str(err.value)
    assert message.startswith("vit_h3.tflite: top-1 ") and "95 % interval" in message and "on 96 images" in message
    assert "raise --max-drop" in message and "\n" not in message


def eager_logits_t(module: torch.nn.Module, images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(eager_logits(module, images))


def _fake_quant_weights(sub: torch.nn.Module, scales: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The int8-dequantised weights a healthy weight-only int8 artefact computes with."""
    params = dict(sub.named_parameters())
    return {n: torch.fake_quantize_per_channel_affine(params[n].detach(), s.float(), torch.zeros(len(s), dtype=torch.int32),
                                                      0, -127, 127).numpy() for n, s in scales.items()}


@pytest.mark.slow  # trains a small model
def test_nesting_is_decided_on_the_same_evidence(trained) -> None:
    """Own scales the reference, nested ones the candidate; the manifest keeps the evidence and its verdict."""
    from hydra_edge.convert.nesting import measure

    model, images, labels = trained
    sub = model.subnetwork(3)
    ranges = nested_ranges(model.named_parameters(), 3, functools.partial(weight_index, cfg=model.config, k=3))
    reference = eager_logits(sub, images)
    n = measure(sub, ranges, EvalSet(images, labels, "held-out"), reference, 0.3)
    assert n.evidence is not None and n.nested == n.evidence.passed and n.cost_pp == n.evidence.cost_pp
    assert n.evidence.images == 96 and n.evidence.reference_right == round(n.top1_per_subnetwork * 96 / 100)
    # the same checkpoint and images always give the same decision, on the same evidence
    assert measure(sub, ranges, EvalSet(images, labels, "held-out"), reference, 0.3) == n
    # a nesting that truly costs: a 12-head model whose weights outside subnetwork 3's columns are 50x
    # larger, so each shared row's range, and with it the nested scale, is far coarser than its slice
    costly_model = copy.deepcopy(model)
    with torch.no_grad():
        for name, w in costly_model.named_parameters():
            index = weight_index(name, model.config, 3)
            if w.dim() == 2 and len(index) == 2:
                inside = w[:, index[1]].clone()
                w.mul_(50)
                w[:, index[1]] = inside
    assert torch.equal(eager_logits_t(costly_model.subnetwork(3), images), eager_logits_t(sub, images))
    coarse = nested_ranges(costly_model.named_parameters(), 3, functools.partial(weight_index, cfg=model.config, k=3))
    costly = measure(sub, coarse, EvalSet(images, labels, "held-out"), reference, 0.3)
    assert not costly.nested and not costly.evidence.passed
    assert costly.evidence.low_pp > 0.3 or costly.evidence.logit_cost_pp > 0.3
    assert costly.sqnr_db_nested < n.sqnr_db_nested - 10
    same = judge(np.ones(4, bool), np.ones(4, bool), 0.0, 0.3)
    assert (same.passed, same.worse, same.better) == (True, 0, 0)


@pytest.mark.slow  # many more generated examples
@pytest.mark.parametrize("name, strategy, test", GENERATED, ids=[name for name, _, _ in GENERATED])
def test_the_generated_tests_hold_on_many_more_examples(name: str, strategy: st.SearchStrategy,
                                                         test: Callable) -> None:
    settings(max_examples=SLOW_EXAMPLES, deadline=None)(given(strategy)(test))()
