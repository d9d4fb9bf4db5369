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

import math
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
    the machine's choice, never the run's. What each field means is ``SETTINGS_HELP``, the one text
    ``train --help`` and docs/training.md's table are made from.
    """

    epochs: Epochs = 30
    batch_size: Annotated[int, Meta(ge=1, le=MAX_BATCH)] = 32
    lr: Annotated[float, Meta(gt=0.0, le=MAX_LR)] = 3e-3  # DeiT's 5e-4 per 512 is ImageNet's; 3e-3 at 32 trained digits best
    weight_decay: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    warmup_epochs: Annotated[int, Meta(ge=0, le=MAX_EPOCHS)] = 2
    label_smoothing: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.1
    weights: Optional[Tuple[Annotated[int, Meta(ge=0, le=1 << 30)], ...]] = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0
    workers: Optional[Annotated[int, Meta(ge=0, le=MAX_WORKERS)]] = None
    head_sampling: HeadSampling = "per-step"
    init_scheme: Name = "timm"
    recipe: Name = "digits"
    lr_batch: Annotated[int, Meta(ge=0, le=MAX_BATCH)] = 0
    min_lr: Annotated[float, Meta(ge=0.0, le=MAX_LR)] = 0.0
    layer_decay: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    decay_all: bool = True
    clip_grad: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    accum_steps: Annotated[int, Meta(ge=1, le=MAX_ACCUM)] = 1
    drop_path: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0
    ema_decay: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0
    mixup: Alpha = 0.0
    cutmix: Alpha = 0.0
    rand_augment: Annotated[int, Meta(ge=0, le=MAX_MAGNITUDE)] = 0
    random_erasing: Share = 0.0
    crop_scale: Share = 0.0
    flip: bool = False
    precision: Precision = "auto"
    compile: bool = False


# What each setting does: the help of its ``train`` option (in this order) and the rows of
# docs/training.md's settings table (``settings_table``; a test checks the page holds it). Settings
# with no option of their own: ``weights`` (``--weights``, a text list), ``workers`` (the machine's),
# ``init_scheme`` and ``recipe`` (``--init-scheme``, ``--recipe``, which pick rather than tune).
SETTINGS_HELP: Dict[str, str] = {
    "epochs": "Epochs to train.",
    "batch_size": "Images per micro-batch, all DDP ranks together.",
    "lr": "Peak learning rate (for --lr-batch images per optimizer step when that is set).",
    "lr_batch": "--lr is for this many images per optimizer step and scales linearly to the real number "
                "(DeiT: 512); 0: --lr as given.",
    "min_lr": "Learning rate the cosine ends at.",
    "warmup_epochs": "Epochs of linear learning-rate warm-up before the cosine.",
    "weight_decay": "AdamW weight decay.",
    "decay_all": "Weight decay on every parameter; --no-decay-all spares biases, norms, cls token and position "
                 "embedding (timm's habit).",
    "layer_decay": "Layer-wise lr decay: the embeddings are layer 0, block i layer i + 1, the final norm and "
                   "classifiers layer depth + 1, and layer l learns at lr x decay^(depth + 1 - l); 1: off.",
    "clip_grad": "Clip the gradients' global norm to this before each optimizer step; 0: off.",
    "accum_steps": "Micro-batches per optimizer step (all train the same head count).",
    "label_smoothing": "Label smoothing of the cross-entropy.",
    "drop_path": "Stochastic depth (drop path) rate of the last block, rising linearly from 0 at the first; "
                 "only in training.",
    "ema_decay": "Keep an EMA of the weights with this decay, updated every optimizer step, saved as "
                 "state_dict_ema and loaded by default afterwards; 0: off.",
    "mixup": "Mixup with a Beta(a, a) share; 0: off.",
    "cutmix": "CutMix with a Beta(a, a) share; 0: off. With mixup, each batch uses one of the two.",
    "rand_augment": "RandAugment magnitude, timm's 0-10 scale (two operations per image); 0: off.",
    "random_erasing": "Probability of erasing a random rectangle of an image; 0: off.",
    "crop_scale": "Random resized crop (bicubic) keeping at least this share of the image; 0: off.",
    "flip": "Random horizontal flips.",
    "precision": "auto: bf16 autocast on a CUDA GPU, fp32 on a CPU. bf16 on a CPU needs native bf16; fp16 needs CUDA.",
    "compile": "torch.compile the model (one graph per head count; the first steps take longer).",
    "seed": "Seeds the initial weights, the data split, the shuffling and the augmentations.",
    "head_sampling": "per-step: one head count per optimizer step, the same on every DDP rank; per-rank: each rank "
                     "draws its own from a generator seeded seed + rank, as the official training script does.",
}


def setting_flag(name: str) -> str:
    """The ``train`` option of setting ``name``: ``--batch-size`` for ``batch_size``; a bool's flag pair."""
    flag = "--" + name.replace("_", "-")
    kind = next(f.type for f in msgspec.inspect.type_info(TrainSettings).fields if f.name == name)
    return f"{flag}/--no-{flag[2:]}" if isinstance(kind, msgspec.inspect.BoolType) else flag


def settings_table() -> str:
    """docs/training.md's table of the settings' options, made from ``SETTINGS_HELP`` and the schema's ranges."""
    rows = ["| option | range | what it does |", "|---|---|---|"]
    for name, help_ in SETTINGS_HELP.items():
        rows.append(f"| `{setting_flag(name)}` | {_range(name)} | {help_.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _range(name: str) -> str:
    kind = next(f.type for f in msgspec.inspect.type_info(TrainSettings).fields if f.name == name)
    if isinstance(kind, msgspec.inspect.BoolType):
        return "on/off"
    if isinstance(kind, msgspec.inspect.LiteralType):
        return ", ".join(kind.values)
    shown = (lambda x: f"{int(x):_}") if isinstance(kind, msgspec.inspect.IntType) else (lambda x: f"{x:g}")
    low = f"> {shown(kind.gt)}" if kind.gt is not None else f">= {shown(kind.ge)}"
    high = f"< {shown(kind.lt)}" if kind.lt is not None else f"<= {shown(kind.le)}"
    return f"{low}, {high}"


class Epoch(msgspec.Struct, omit_defaults=True):
    """One entry of the history (``checkpoint.pt``'s and ``history.json``): what an epoch ended with."""

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


class TrainingState(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``checkpoint.pt``'s ``train`` entry. Optimizer and schedule stay the plain dicts torch loads
    (checked against their schemas); one epoch of history per epoch done, never more than planned.
    Written by ``training_entry`` and read by ``read_resume``, both through this schema."""

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


# torch's own state dicts in the ``train`` entry: tensors inside, stored as torch gives them and loads them.
TORCH_STATE = ("optimizer", "schedule", "scaler")


def training_entry(where: str, **fields: Any) -> Dict[str, Any]:
    """The ``train`` entry a checkpoint stores (``TrainingState``'s fields), checked as ``read_resume``
    will read it, so a run never saves a state it could not resume from; a field at its default
    (no EMA, no loss scale) is left out, as checkpoints written before it existed have it."""
    return codec.to_plain(codec.convert(fields, TrainingState, where, HINT), opaque=TORCH_STATE)


def history_json(history: List[Any], where: str) -> bytes:
    """``history.json``: the run's epochs as JSON, checked against ``Epoch`` as the checkpoint's are."""
    return codec.encode(history, List[Epoch], where, HINT)


class DataRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the images come from and how they are split: ``checkpoint.pt``'s ``data`` entry, and the
    spec training, ``eval`` and ``convert`` load data by (``hydra_edge.train.data.DataSpec`` is this
    class), so what a checkpoint records and what a run was given cannot drift apart.

    ``source`` is a built-in set's name or a folder. Read from a file, the schema checks every field;
    built in code, ``__post_init__`` checks the share held out, the one value a user types.
    """

    source: Name = "digits"
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0
    val_fraction: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.2

    def __post_init__(self) -> None:
        f = self.val_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (math.isfinite(f) and 0 < f < 1):
            raise HydraEdgeError(f"held-out fraction {f!r} is not a number between 0 and 1 (both excluded); "
                                 "give e.g. 0.2 to hold out a fifth of the images")

    def to_dict(self) -> dict[str, Any]:
        """The plain dict a checkpoint and a bundle's manifest store."""
        return msgspec.to_builtins(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "data record") -> "DataRecord":
        """``d`` (a checkpoint's ``data`` entry; ``where`` names it) checked against the schema; one line otherwise."""
        return codec.convert(dict(d), cls, where, HINT)


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
