"""The training state a checkpoint carries: what ``hydra-edge train --resume`` continues from.

``checkpoint.pt`` holds, beside the weights, a ``train`` entry (epochs done, optimizer and schedule
state, the history, the run's settings) and a ``data`` entry (where the images come from). A
damaged one used to fail mid-run as a KeyError or a TypeError, or silently train 35 epochs of a
30-epoch run (``epoch: -5``) or none (``epoch: 10**12``); read through these schemas it is one
line naming the field, before the first epoch. The bounds are the command line's (``train``'s
options use the same constants), so a run the CLI can start is a run these schemas accept.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Tuple, get_args

import msgspec
from msgspec import Meta

from ..errors import HydraEdgeError
from . import codec
from .fields import Finite, Name, NonNegative, NonNegFloat, Percent, Positive, check

MAX_EPOCHS = 100_000
MAX_BATCH = 1_000_000
MAX_LR = 10.0  # a peak learning rate above this diverges at once
MAX_SEED = 2**32 - 1  # what numpy's and DistributedSampler's seeds take
MAX_WORKERS = 256
HINT = "train again into another --out (its weights still load with --checkpoint)"

Epochs = Annotated[int, Meta(ge=1, le=MAX_EPOCHS)]
HeadSampling = Literal["per-step", "per-rank"]  # train.HeadSampler's modes
HEAD_SAMPLING = get_args(HeadSampling)


class TrainSettings(msgspec.Struct, frozen=True):
    """What a run is trained with, kept in its checkpoint so a resumed run continues with its own values."""

    epochs: Epochs = 30
    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH)] = 32
    # DeiT's 5e-4 per 512 is for ImageNet; 3e-3 at 32 trained digits best of those tried
    lr: Annotated[float, Meta(gt=0.0, le=MAX_LR)] = 3e-3
    weight_decay: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    warmup_epochs: Annotated[int, Meta(ge=0, le=MAX_EPOCHS)] = 2
    label_smoothing: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.1
    # sampling weights per head count (official: integers summing to 100)
    weights: Optional[Tuple[Annotated[int, Meta(ge=0, le=1 << 30)], ...]] = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0
    # image-decoding processes for folder data; in-memory digits needs none
    workers: Annotated[int, Meta(ge=0, le=MAX_WORKERS)] = 0
    head_sampling: HeadSampling = "per-step"  # HeadSampler's mode
    init_scheme: Name = "timm"  # how the model was first initialised (vit.INIT_SCHEMES), kept with the run


class Epoch(msgspec.Struct):
    """One entry of the history: what an epoch ended with."""

    epoch: Epochs
    loss: Finite
    lr: NonNegFloat
    drawn: Dict[int, NonNegative]  # head count -> steps that trained it
    val_top1: Dict[int, Percent]  # head count -> held-out accuracy
    world_size: Positive


class Optimizer(msgspec.Struct, forbid_unknown_fields=True):
    """``torch.optim.Optimizer.state_dict()``: per-parameter tensors, and the groups that name them."""

    state: Dict[int, Dict[str, Any]]
    param_groups: List[Dict[str, Any]]


class Schedule(msgspec.Struct):
    """``LambdaLR.state_dict()``: the fields its ``load_state_dict`` and ``step`` rely on."""

    last_epoch: Annotated[int, Meta(ge=-1, le=1 << 53)]
    base_lrs: List[NonNegFloat]
    lr_lambdas: List[None]


class TrainingState(msgspec.Struct, forbid_unknown_fields=True):
    """``checkpoint.pt``'s ``train`` entry. Optimizer and schedule stay the plain dicts torch loads
    (checked against their schemas); one epoch of history per epoch done, never more than planned."""

    epoch: Annotated[int, Meta(ge=0, le=MAX_EPOCHS)]
    optimizer: Dict[str, Any]
    schedule: Dict[str, Any]
    history: List[Epoch]
    settings: Optional[TrainSettings] = None  # runs from before settings were kept continue with the defaults

    def __post_init__(self) -> None:
        check(self.optimizer, Optimizer, ".optimizer")
        check(self.schedule, Schedule, ".schedule")
        if len(self.history) != self.epoch:
            raise ValueError(f"`.epoch`: {self.epoch} epochs trained, but the history holds {len(self.history)}")
        if self.settings is not None and self.epoch > self.settings.epochs:
            raise ValueError(f"`.epoch`: {self.epoch} epochs trained of a {self.settings.epochs}-epoch run")


class DataRecord(msgspec.Struct, forbid_unknown_fields=True):
    """``checkpoint.pt``'s ``data`` entry: ``hydra_edge.train.data.DataSpec``, field for field."""

    source: Name = "digits"
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0
    val_fraction: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.2


class Resume(msgspec.Struct, frozen=True):
    """What a resumed run continues from; ``data`` is None in checkpoints that do not say."""

    train: TrainingState
    data: Optional[DataRecord] = None


def read_resume(saved: Mapping[str, Any], where: str) -> Resume:
    """The training state of a loaded checkpoint (``where`` names its file), checked; one line otherwise."""
    if "train" not in saved:
        raise HydraEdgeError(f"{where} holds no training state to resume; choose another --out")
    return Resume(train=codec.convert(saved["train"], TrainingState, f"{where} ['train']", HINT),
                  data=read_data(saved, where))


def read_data(saved: Mapping[str, Any], where: str) -> Optional[DataRecord]:
    """The data a loaded checkpoint says it was trained on, checked; None when it does not say."""
    data = saved.get("data")
    return None if data is None else codec.convert(data, DataRecord, f"{where} ['data']", HINT)
