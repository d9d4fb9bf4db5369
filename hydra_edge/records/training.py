"""The training state a checkpoint carries: what ``hydra-edge train --resume`` continues from.

``checkpoint.pt`` holds, beside the weights (and the EMA weights, ``state_dict_ema``), a ``train``
entry (epochs done, optimizer and schedule state, the history, the run's settings, the EMA's update
count, an fp16 run's loss scale) and a ``data`` entry (where the images come from). A
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
MAX_ACCUM = 4096  # micro-batches per optimizer step: 8 GPUs x 4096 x 1 image is ImageNet's batch many times over
MAX_ALPHA = 100.0  # mixup / cutmix Beta parameter: 100 already mixes every pair half and half
MAX_MAGNITUDE = 9  # RandAugment on timm's 0-10 scale; kornia's (0-30) excludes its top
HINT = "train again into another --out (its weights still load with --checkpoint)"

Epochs = Annotated[int, Meta(ge=1, le=MAX_EPOCHS)]
HeadSampling = Literal["per-step", "per-rank"]  # train.HeadSampler's modes
HEAD_SAMPLING = get_args(HeadSampling)
# auto: bf16 autocast on CUDA, fp32 on a CPU (train.recipe.autocast_dtype says what each runs as)
Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS = get_args(Precision)
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
Alpha = Annotated[float, Meta(ge=0.0, le=MAX_ALPHA)]


class TrainSettings(msgspec.Struct, frozen=True):
    """What a run is trained with, kept in its checkpoint so a resumed run continues with its own values.

    The defaults are the ``digits`` recipe (``hydra_edge.train.recipe``): what every run trained with
    before recipes existed, so a checkpoint saved without a field resumes as it was trained. A
    setting that is 0 is off (no clipping, no EMA, no mixup, ...). ``workers`` and ``compile`` are
    the machine's choice, never the run's.
    """

    epochs: Epochs = 30
    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH)] = 32  # images per micro-batch, all ranks together
    # DeiT's 5e-4 per 512 is for ImageNet; 3e-3 at 32 trained digits best of those tried
    lr: Annotated[float, Meta(gt=0.0, le=MAX_LR)] = 3e-3
    weight_decay: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    warmup_epochs: Annotated[int, Meta(ge=0, le=MAX_EPOCHS)] = 2
    label_smoothing: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.1
    # sampling weights per head count (official: integers summing to 100)
    weights: Optional[Tuple[Annotated[int, Meta(ge=0, le=1 << 30)], ...]] = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0
    # image-decoding processes for folder data; None: the loop's default for the device
    workers: Optional[Annotated[int, Meta(ge=0, le=MAX_WORKERS)]] = None
    head_sampling: HeadSampling = "per-step"  # HeadSampler's mode
    init_scheme: Name = "timm"  # how the model was first initialised (vit.INIT_SCHEMES), kept with the run
    recipe: Name = "digits"  # the named recipe these values started from (train.recipe.RECIPES)
    # lr is the peak for this many images per optimizer step, scaled linearly to the real one (DeiT: 512)
    lr_batch: Annotated[int, Meta(ge=0, le=MAX_BATCH)] = 0
    min_lr: Annotated[float, Meta(ge=0.0, le=MAX_LR)] = 0.0  # where the cosine ends
    layer_decay: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0  # lr x decay^(depth + 1 - layer); 1: one lr
    decay_all: bool = True  # False: no weight decay on biases, norms, cls token, position embedding (timm's habit)
    clip_grad: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0  # the most the gradients' global norm may be
    accum_steps: Annotated[int, Meta(ge=1, le=MAX_ACCUM)] = 1  # micro-batches per optimizer step
    drop_path: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0  # stochastic depth of the last block
    ema_decay: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0  # weight kept per step by the EMA copy
    mixup: Alpha = 0.0  # Beta(a, a) mixing share
    cutmix: Alpha = 0.0  # Beta(a, a) share of the image kept; with mixup, each batch uses one of the two
    rand_augment: Annotated[int, Meta(ge=0, le=MAX_MAGNITUDE)] = 0  # magnitude of two operations per image
    random_erasing: Share = 0.0  # probability an image has a rectangle erased
    crop_scale: Share = 0.0  # smallest area share a random resized crop keeps
    flip: bool = False  # random horizontal flips
    precision: Precision = "auto"
    compile: bool = False  # torch.compile the model


class Epoch(msgspec.Struct):
    """One entry of the history: what an epoch ended with."""

    epoch: Epochs
    loss: Finite
    lr: NonNegFloat
    drawn: Dict[int, NonNegative]  # head count -> optimizer steps that trained it
    val_top1: Dict[int, Percent]  # head count -> held-out accuracy
    world_size: Positive
    val_top1_ema: Optional[Dict[int, Percent]] = None  # the same for the EMA weights, when the run keeps them


class Optimizer(msgspec.Struct, forbid_unknown_fields=True):
    """``torch.optim.Optimizer.state_dict()``: per-parameter tensors, and the groups that name them."""

    state: Dict[int, Dict[str, Any]]
    param_groups: List[Dict[str, Any]]


class Schedule(msgspec.Struct):
    """``LambdaLR.state_dict()``: the fields its ``load_state_dict`` and ``step`` rely on."""

    last_epoch: Annotated[int, Meta(ge=-1, le=1 << 53)]
    base_lrs: List[NonNegFloat]
    lr_lambdas: List[None]


class Scaler(msgspec.Struct):
    """``torch.amp.GradScaler.state_dict()``: the loss scale and how it grows, which an fp16 run resumes with."""

    scale: Annotated[float, Meta(gt=0.0)]
    growth_factor: Annotated[float, Meta(gt=1.0)]
    backoff_factor: Annotated[float, Meta(gt=0.0, lt=1.0)]
    growth_interval: Positive
    _growth_tracker: NonNegative


class TrainingState(msgspec.Struct, forbid_unknown_fields=True):
    """``checkpoint.pt``'s ``train`` entry. Optimizer and schedule stay the plain dicts torch loads
    (checked against their schemas); one epoch of history per epoch done, never more than planned."""

    epoch: Annotated[int, Meta(ge=0, le=MAX_EPOCHS)]
    optimizer: Dict[str, Any]
    schedule: Dict[str, Any]
    history: List[Epoch]
    settings: Optional[TrainSettings] = None  # runs from before settings were kept continue with the defaults
    ema_updates: NonNegative = 0  # optimizer steps the EMA weights (``state_dict_ema``) have averaged
    scaler: Optional[Dict[str, Any]] = None  # ``torch.amp.GradScaler.state_dict()`` of an fp16 run

    def __post_init__(self) -> None:
        check(self.optimizer, Optimizer, ".optimizer")
        check(self.schedule, Schedule, ".schedule")
        if self.scaler is not None:
            check(self.scaler, Scaler, ".scaler")
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
