"""Which classes a model has, and giving a trained model new ones.

A checkpoint (hydra-edge's own, the official release, timm/DeiT) fine-tuned on data whose classes
are not its own keeps every backbone weight and gets a new classifier sized to the data (every
per-head-count classifier when they are separate): the backbone is what transfers, a classifier's
rows mean the classes it was trained on and nothing else. The same holds for ``--init`` from
DeiT-tiny, the paper's start, whose ImageNet classifier must not land on a four-class model. Each
replacement is said in one line, so a user never fine-tunes on a classifier they did not expect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..model.checkpoint import checkpoint_classes, copy_first_heads, read_file, state_dict_of
from ..model.config import HydraConfig
from ..model.hydravit import HydraViT
from .data import class_list


def fit_classes(model: HydraViT, classes: Sequence[str], model_classes: Sequence[str] | None,
                origin: str | Path) -> str | None:
    """Give ``model`` a new classifier for ``classes`` (the data's) when they are not its own: another
    count, or other names where the model's are known (``model_classes``, from ``checkpoint_classes``).
    The backbone is kept. Returns the line for the user, naming the classes and ``origin`` (the
    checkpoint); None when the model already has these classes.
    """
    had = model.config.num_classes
    if len(classes) == had and (model_classes is None or list(model_classes) == list(classes)):
        return None
    model.reset_classifier(len(classes))
    return (f"new classifier for {_classes(classes)} on the backbone of {origin}; "
            f"it had {_classes(model_classes) if model_classes else f'{had} classes'}")


def init_first_heads(model: HydraViT, path: str | Path, classes: Sequence[str], ema: bool = True) -> str:
    """``--init``: the first heads of ``model`` (built for ``classes``) from a narrower checkpoint
    (DeiT-tiny: heads 1-3). Its classifier is copied too only when its classes are these: the same
    count, and the same names where the file has them; otherwise the model keeps the classifier it was
    built with. Returns the line for the user.
    """
    if model.config.num_classes != len(classes):
        raise ValueError(f"the model has {model.config.num_classes} outputs for {len(classes)} classes")
    obj = read_file(path)
    state = state_dict_of(obj, path, ema=ema)
    theirs = state["head.weight"].shape[0] if "head.weight" in state else None
    names = checkpoint_classes(obj, path, theirs) if theirs is not None else None
    same = theirs == len(classes) and (names is None or names == list(classes))
    k = copy_first_heads(model, state, path, classifier=same)
    line = f"initialised heads 1-{k} from {path}"
    if same:
        return line
    had = _classes(names) if names else "no classifier" if theirs is None else f"{theirs} classes"
    return f"{line}, its backbone only: a new classifier for {_classes(classes)}; it had {had}"


def describe_input(cfg: HydraConfig) -> str:
    """``input 64x64 px RGB``: what every image is made into before the model sees it."""
    channels = {1: "grayscale", 3: "RGB"}.get(cfg.in_chans, f"{cfg.in_chans} channels")
    return f"input {cfg.img_size}x{cfg.img_size} px {channels}"


def describe_model(cfg: HydraConfig, classes: Sequence[str] | None, limit: int = 5) -> str:
    """What a model takes and tells apart, in one line: ``input 64x64 px RGB; 4 classes ('cat', ...)``;
    printed where training starts and by ``info``, so a user sees the size their images are cut to."""
    names = _classes(classes, limit) if classes else f"{cfg.num_classes} classes (names unknown)"
    return f"{describe_input(cfg)}; {names}"


def _classes(classes: Sequence[str], limit: int = 5) -> str:
    return f"{len(classes)} classes ({class_list(classes, limit)})"
