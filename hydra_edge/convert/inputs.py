"""The run's inputs (target, heads, checkpoint, data, output folder), checked up front so that each
mistake is one line raised before anything is written; and, per process, the model and images they
name (``context``), loaded once however many artefacts use them."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HydraEdgeError
from ..model.config import HydraConfig
from .attention import attention_matmuls
from .formats import exporter
from .layout import LAYOUTS
from .nesting import max_cost
from .options import ConvertOptions
from .targets import Target, Variant, load_target
from .verify import EvalSet

RANDOM_BASIS = "random inputs (agreement with fp32 only; no labelled data)"
CALIBRATION_IMAGES = 256  # train-split images handed to static quantisers (they take what they need)
RANDOM_EVAL_IMAGES = 64


@dataclass(frozen=True)
class Inputs:
    """What ``opts`` names, loaded and checked; nothing is written before all of it is."""

    target: Target
    variants: tuple[Variant, ...]
    config: HydraConfig
    heads: tuple[int, ...]
    data: dict[str, Any] | None
    classes: list[str] | None
    weights: str  # the checkpoint's entry converted (checkpoint.weights_entry)
    warning: str | None = None  # the checkpoint's own held-out accuracy says it learnt little (one line)


def check_inputs(opts: ConvertOptions) -> Inputs:
    """Load and check every input; each mistake is one line, raised before anything is written."""
    from ..model.checkpoint import EMA_ENTRIES, checkpoint_classes, load_checkpoint_file, weights_entry
    from ..model.config import parse_heads
    from ..train.advice import learnt_little, recorded_accuracy
    from ..train.data import DataSpec, load_data

    if opts.max_drop < 0 or (opts.jobs is not None and opts.jobs < 1) or opts.eval_limit < 1:
        raise HydraEdgeError("--max-drop must be >= 0, --jobs and --eval-limit >= 1")
    if opts.layout not in LAYOUTS:
        raise HydraEdgeError(f"unknown --layout {opts.layout!r}; choose one of {', '.join(LAYOUTS)}")
    target = load_target(opts.target)
    variants = target.variants(opts.quant, opts.optional)
    for v in variants:
        attention_matmuls(v.options, f"{target.source}: {v.key}")
        if v.quant in exporter(v.format).NESTED:
            max_cost(v.options, f"{target.source}: {v.key}")
    model, saved = load_checkpoint_file(opts.checkpoint, ema=opts.ema)
    cfg = model.config
    heads = parse_heads(opts.heads, cfg.num_heads) if opts.heads else cfg.heads
    if cfg.separate_heads and set(heads) - set(cfg.heads):
        raise HydraEdgeError(f"{opts.checkpoint} has classifiers only for heads {list(cfg.heads)}; pick --heads among them")
    data = _data_spec(saved, opts.data, f"{opts.checkpoint} ['data']")
    # The class names a device labels its predictions with: the checkpoint's own, else its data's. The data
    # is loaded now so that a folder that is gone, or whose classes are not the model's, is one line.
    named = checkpoint_classes(saved, opts.checkpoint, cfg.num_classes)
    _utf8_classes(named or [], opts.checkpoint)
    classes = load_data(DataSpec.from_dict(data), cfg, named).classes if data is not None else named
    weights = weights_entry(saved, opts.ema)
    accuracy = recorded_accuracy(saved, ema=weights in EMA_ENTRIES)
    warning = learnt_little(accuracy, cfg.num_classes, opts.checkpoint) if accuracy else None
    return Inputs(target, variants, cfg, tuple(heads), data, classes, weights, warning)


def _utf8_classes(names: list[str], checkpoint: Path) -> None:
    """Refuse, in one line naming the class, names no manifest can hold.

    Why: ``train`` now refuses a class folder whose name is not UTF-8, but a checkpoint saved before carries
    that name as Python read it (surrogate-escaped, ``caf\\udce9``), and manifest.json is UTF-8: the run
    would fail at its first manifest write, with the bundle folder locked, instead of here.
    """
    for i, name in enumerate(names):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            try:  # the bytes the folder's name had, printable (caf\xe9), as train's refusal shows them
                shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a lone surrogate that was never a byte
                shown = name.encode("utf-8", "backslashreplace").decode("ascii")
            raise HydraEdgeError(f"{checkpoint}: class {i}'s name {shown} is not UTF-8 text (its class folder was "
                                 "named in another encoding when it was trained), so no manifest can hold it; "
                                 "rename that class folder in UTF-8 and train again") from None


def _data_spec(raw: dict[str, Any], override: str | None, where: str) -> dict[str, Any] | None:
    """``--data`` wins, keeping the checkpoint's split seed; else the checkpoint's own spec; else None.
    ``where`` names the checkpoint's spec in the line that refuses it."""
    from ..train.data import DataSpec

    spec = raw.get("data") if isinstance(raw.get("data"), dict) else None
    if override is not None:
        return DataSpec.from_dict({**(spec or DataSpec().to_dict()), "source": override}, where).to_dict()
    return DataSpec.from_dict(spec, where).to_dict() if spec else None


def prepare_out(out: Path) -> None:
    """Create the output folder, or say in one line why it cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HydraEdgeError(f"cannot create output folder {out}: {e.strerror}; choose a writable folder") from None
    if not os.access(out, os.W_OK):
        raise HydraEdgeError(f"output folder {out} is not writable; choose a writable folder")


def _evenly(dataset: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples spread over the dataset (folders are sorted by class, so never the first n)."""
    from torch.utils.data import Subset

    from ..train.data import as_arrays

    idx = np.unique(np.linspace(0, len(dataset) - 1, min(n, len(dataset))).round().astype(int))
    return as_arrays(Subset(dataset, idx.tolist()))


@functools.lru_cache(maxsize=2)
def context(checkpoint: str, ckpt_sha: str, data_json: str, eval_limit: int,
            ema: bool) -> tuple[Any, EvalSet, np.ndarray]:
    """Model, evaluation images and calibration images, loaded once per process (``Job.context_key``)."""
    from ..model.checkpoint import load_checkpoint
    from ..train.data import DataSpec, load_data

    model = load_checkpoint(checkpoint, ema=ema)
    cfg = model.config
    data = json.loads(data_json)
    if data is None:
        rng = np.random.default_rng(0)
        shape = (cfg.in_chans, cfg.img_size, cfg.img_size)
        images = rng.standard_normal((min(eval_limit, RANDOM_EVAL_IMAGES), *shape), dtype=np.float32)
        calibration = rng.standard_normal((CALIBRATION_IMAGES, *shape), dtype=np.float32)
        return model, EvalSet(images, None, RANDOM_BASIS), calibration
    splits = load_data(DataSpec.from_dict(data), cfg)
    images, labels = _evenly(splits.val, eval_limit)
    calibration, _ = _evenly(splits.train, CALIBRATION_IMAGES)
    return model, EvalSet(images, labels, f"held-out split of {data['source']!r}"), calibration
