"""Stochastic head sampling: each optimizer step trains one subnetwork, drawn from the served head counts.

Reads top to bottom: settings, sampling, the machine's choices (threads, workers), the loop. The
recipe's parts (optimizer groups, schedule, EMA, precision) come from ``train.recipe`` and the
batch augmentations from ``train.augment``. Runs in one process or under torchrun (DDP: gloo on
CPU, nccl on GPU). Every epoch ends with an atomic checkpoint holding the optimizer, schedule,
EMA weights, loss scale and history, and every epoch's random draws (augmentations, drop path)
start from a seed of (seed, epoch, rank), so ``resume`` continues exactly where a run stopped.
"""

from __future__ import annotations

import itertools
import os
import random
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ..atomic import write_bytes, write_json
from ..errors import HydraEdgeError
from ..model.checkpoint import load_state, read_file
from ..model.config import HydraConfig
from ..model.hydravit import HydraViT
from ..model.sizes import subnet_size
from ..records.training import (HEAD_SAMPLING, HINT, TrainingState, TrainSettings, history_json, read_resume,
                                training_entry)
from .augment import TrainingTransform, training_reads
from .data import DataSplits
from .evaluate import accuracy_rows, right_per_heads, top1
from .plots import plot_accuracy
from .recipe import autocast_dtype, ema_copy, optimizer_and_schedule, peak_lr, settings_for
from .transfer import describe_model

CHECKPOINT = "checkpoint.pt"
OUTPUTS = (CHECKPOINT, "history.json", "accuracy.json", "accuracy.png")  # what a run writes into its folder
EMA_ENTRY = "state_dict_ema"  # where timm and the release keep EMA weights; model.checkpoint loads it by default

# What a run is trained with, as its command-line option: a resumed run keeps its own values. The
# machine's choices (decoding processes, compiling) and how a new model was initialised are not among them.
MACHINE = ("workers", "compile")
RUN_OPTIONS = {name: "--" + name.replace("_", "-") for name in TrainSettings.__struct_fields__
               if name not in MACHINE + ("init_scheme",)}
# Below this much work per micro-batch (GMACs of the largest subnetwork's forward) one CPU thread is
# fastest: the digits preset (0.25) trains 4-9x slower on 2 threads of a shared 2-core host (docs/training.md).
ONE_THREAD_GMACS = 5.0


def refuse_change(option: str, given: Any, recorded: Any, where: Path) -> None:
    """One line for a resumed run asked to change what it was trained with, without ``--override``."""
    shown = lambda v: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    raise HydraEdgeError(f"{option} {shown(given)} differs from the run in {where}, which has {shown(recorded)}; "
                         f"drop {option} to continue the run as it was, or add --override to change it")


def resumed_settings(state: TrainingState, given: dict[str, Any], override: bool, where: Path,
                     machine: dict[str, Any] | None = None) -> TrainSettings:
    """The settings a resumed run continues with: its own (recipe, epochs, batch, lr and its schedule,
    seed, sampling weights, ...), not the command line's defaults, which would stretch a 12-epoch
    schedule to 30.

    ``given`` holds only what the user typed (``RUN_OPTIONS`` names); a value that differs from the
    run's is refused unless ``override``, and so are fewer epochs than the run has trained. With
    ``override``, another ``recipe`` starts from that recipe's values. ``machine`` holds this
    machine's choices (``MACHINE``), never the run's.
    """
    recorded = state.settings  # None: a run from before settings were kept, which takes the defaults
    run = recorded or TrainSettings()
    for name, value in given.items():
        if recorded is not None and value != getattr(recorded, name) and not override:
            refuse_change(RUN_OPTIONS[name], value, getattr(recorded, name), where)
    if given.get("recipe", run.recipe) != run.recipe:
        run = settings_for(given["recipe"])
    fresh = TrainSettings()
    settings = msgspec.structs.replace(run, **given, **{**{m: getattr(fresh, m) for m in MACHINE}, **(machine or {})})
    if settings.epochs < state.epoch:
        raise HydraEdgeError(f"{where} has trained {state.epoch} epochs already; give --epochs {state.epoch} or more "
                             f"(or leave it out to finish the run's own {run.epochs})")
    return settings


@dataclass
class TrainResult:
    checkpoint: Path
    accuracy: dict[int, float] = field(default_factory=dict)  # held-out top-1 per head count (rank 0 only)
    right: dict[int, np.ndarray] = field(default_factory=dict)  # per head count, each held-out image right or not
    weights: str = "state_dict"  # the checkpoint entry ``accuracy`` was measured on: the one loaded by default


class HeadSampler:
    """Draws one head count per optimizer step, by ``mode``; the same draws again after a resume.

    ``"per-step"``: a generator per epoch, seeded by seed and epoch, so every DDP rank runs the same
    subnetwork in a step and N ranks take the steps of one process with their whole batch.
    ``"per-rank"``: the official training script's draw: one generator per rank seeded ``seed + rank``
    (timm seeds Python's ``random`` so), running on across epochs, each draw
    ``choices(heads, weights=w / sum(w))``; ranks train different subnetworks in the same step. The
    official script shares that generator with its random-erasing augmentation, whose draws here come
    from torch's; the sequence here is the official one without those extra draws.
    """

    def __init__(self, heads: tuple[int, ...], weights: tuple[int, ...] | None, seed: int,
                 mode: str = "per-step", rank: int = 0) -> None:
        if weights is not None and (len(weights) != len(heads) or sum(weights) <= 0 or min(weights) < 0):
            raise HydraEdgeError(
                f"--weights needs {len(heads)} non-negative integers (one per head count {list(heads)}), got {list(weights)}"
            )
        if mode not in HEAD_SAMPLING:
            raise HydraEdgeError(f"unknown head sampling {mode!r}; choose one of {', '.join(HEAD_SAMPLING)}")
        self.heads, self.weights, self.seed, self.mode, self.rank = heads, weights, seed, mode, rank
        # per-rank draws with the official script's fractions (its weights sum to 100: w / 100)
        self._fractions = None if weights is None else [w / sum(weights) for w in weights]
        self._rng: random.Random | None = None

    def for_epoch(self, epoch: int, steps: int) -> random.Random:
        """The generator that draws the ``steps`` head counts of ``epoch`` (epochs asked for in order)."""
        if self.mode == "per-step":
            return random.Random(self.seed * 100_003 + epoch)
        if self._rng is None:  # this process's first epoch: a resumed run replays the draws before it
            self._rng = random.Random(self.seed + self.rank)
            for _ in range(epoch * steps):
                self.draw(self._rng)
        return self._rng

    def draw(self, rng: random.Random) -> int:
        if self.mode == "per-rank":
            return rng.choices(self.heads, weights=self._fractions)[0]
        return rng.choices(self.heads, weights=self.weights)[0]


def cpu_threads(cfg: HydraConfig, batch_size: int) -> int:
    """CPU threads for training a model of ``cfg``: one for a small model (its operations are too small
    to share out, and a thread waiting for a busy core stalls every step), else the cores that other
    processes leave free (the 1-minute load average), at least one."""
    if subnet_size(cfg, max(cfg.heads)).gmacs * batch_size < ONE_THREAD_GMACS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


def default_workers(dataset: Dataset, device: torch.device) -> int:
    """Image-decoding processes: none for data already in memory; on a GPU enough to keep it fed, on a
    CPU one per two cores (the rest compute)."""
    if isinstance(dataset, TensorDataset):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(8, cores) if device.type == "cuda" else max(1, cores // 2)


def _distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return dist.get_rank(), world, device


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not enabled, transient=False,
    )


def describe_run(data: DataSplits, cfg: HydraConfig, settings: TrainSettings, dtype: torch.dtype | None,
                 device: torch.device, world: int) -> str:
    """The line a run starts with: what it reads, what it trains, how and where."""
    precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast, loss scaling"}[dtype]
    where = (f"{torch.cuda.get_device_name(device)}" if device.type == "cuda"
             else f"cpu, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}")
    batch = settings.batch_size * settings.accum_steps
    return (f"training on {data.spec.source}: {describe_model(cfg, data.classes)}; recipe {settings.recipe}, "
            f"precision {precision}, device {where}{f' x {world}' if world > 1 else ''}, "
            f"{batch} images per step, peak lr {peak_lr(settings):.3g}")


def epoch_line(epoch: int, epochs: int, loss: float, accuracy: dict[int, float],
               accuracy_ema: dict[int, float] | None) -> str:
    """One line per epoch: its mean loss and the held-out top-1 (%) of every head count."""
    shown = lambda acc: " ".join(f"{k}:{acc[k]:.1f}" for k in sorted(acc))  # noqa: E731
    ema = f" | EMA {shown(accuracy_ema)}" if accuracy_ema is not None else ""
    return f"epoch {epoch}/{epochs} loss {loss:.3f} | held-out top-1 % by heads {shown(accuracy)}{ema}"


def train(
    model: HydraViT, data: DataSplits, settings: TrainSettings, out: str | Path, resume: bool = False
) -> TrainResult:
    """Train ``model`` with stochastic head sampling and ``settings``' recipe; write checkpoint, history
    and accuracy into ``out``."""
    out = Path(out)
    rank, world, device = _distributed()
    dtype = autocast_dtype(settings.precision, device)  # a precision the device lacks: one line, nothing written
    torch.manual_seed(settings.seed)
    heads = model.config.heads
    model.drop_path_rate = settings.drop_path
    model.to(device)

    # Data: each step takes `group` micro-batches of `per_rank` images per rank; leftovers are dropped,
    # as a partial batch is, so every optimizer step sees the same number of images.
    reads = training_reads(data.train, model.config, settings)
    transform = TrainingTransform(settings, model.config, len(data.classes)).to(device)
    shard = DistributedSampler(reads, num_replicas=world, rank=rank, shuffle=True, seed=settings.seed)
    per_rank = max(1, settings.batch_size // world)
    workers = default_workers(reads, device) if settings.workers is None else settings.workers
    loader = DataLoader(reads, batch_size=per_rank, sampler=shard, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                        drop_last=len(shard) >= per_rank)
    if len(loader) == 0:
        raise HydraEdgeError(f"no training images in {data.spec.source}; add images or check the folder layout")
    group = min(settings.accum_steps, len(loader))
    steps = len(loader) // group  # optimizer steps per epoch

    # Model and recipe parts. Separate classifiers: each step trains one, so DDP must expect the others
    # to get no gradient.
    ddp = nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=model.config.separate_heads) if world > 1 else None
    net: nn.Module = model if ddp is None else ddp
    if settings.compile:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(heads))
        net = torch.compile(net)  # one graph per head count
    optimizer, schedule = optimizer_and_schedule(model, settings, steps)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
    ema = ema_copy(model, settings.ema_decay) if settings.ema_decay else None
    sampler = HeadSampler(heads, settings.weights, settings.seed, settings.head_sampling, rank)

    start, history = 0, []
    if resume and (out / CHECKPOINT).is_file():
        start, history, ema = _resume(out / CHECKPOINT, model, optimizer, schedule, scaler, ema, settings)

    def evaluate(weights: nn.Module) -> dict[int, np.ndarray]:
        return right_per_heads(weights, data.val, heads, workers=default_workers(data.val, device), autocast=dtype)

    final_right = None  # the held-out outcomes of the weights the checkpoint loads by default, once evaluated

    with _progress(rank == 0) as bar:
        bar.console.print(describe_run(data, model.config, settings, dtype, device, world), highlight=False,
                          soft_wrap=True)
        # A resumed run that has trained every epoch only evaluates: no "training 0/0" bar, one line instead.
        remaining = (settings.epochs - start) * steps
        task = bar.add_task("training", total=remaining, visible=remaining > 0)
        if not remaining:
            bar.console.print(f"all {settings.epochs} epochs trained already ({out / CHECKPOINT}); evaluating",
                              highlight=False, soft_wrap=True)
        for epoch in range(start, settings.epochs):
            shard.set_epoch(epoch)
            torch.manual_seed((settings.seed * 100_003 + epoch) * 1_009 + rank)  # augmentations, drop path
            rng = sampler.for_epoch(epoch, steps)
            net.train()
            batches = iter(loader)
            loss_sum, drawn = torch.zeros((), device=device), {k: 0 for k in heads}
            for _ in range(steps):
                k = sampler.draw(rng)  # one subnetwork per optimizer step, all its micro-batches
                drawn[k] += 1
                for micro, (x, y) in enumerate(itertools.islice(batches, group)):
                    x, target = transform(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                    sync = ddp.no_sync() if ddp is not None and micro < group - 1 else nullcontext()
                    with sync:
                        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                            loss = F.cross_entropy(net(x, heads=k), target,
                                                   label_smoothing=settings.label_smoothing) / group
                        scaler.scale(loss).backward()
                    loss_sum += loss.detach()
                if settings.clip_grad:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), settings.clip_grad)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                if ema is not None:
                    ema.update_parameters(model)
                bar.update(task, advance=1, description=f"epoch {epoch + 1}/{settings.epochs} k={k:<2}")
            loss = loss_sum.item() / steps
            if rank == 0:
                final_right = right = evaluate(model)
                accuracy = top1(right)
                if ema is not None:
                    final_right = evaluate(ema.module)
                accuracy_ema = top1(final_right) if ema is not None else None
                bar.console.print(epoch_line(epoch + 1, settings.epochs, loss, accuracy, accuracy_ema),
                                  highlight=False, soft_wrap=True)
                history.append({
                    "epoch": epoch + 1, "loss": loss, "lr": max(schedule.get_last_lr()), "drawn": drawn,
                    "val_top1": accuracy, "world_size": world,
                    **({"val_top1_ema": accuracy_ema} if accuracy_ema is not None else {}),
                })
                _save(out / CHECKPOINT, model, data, settings, epoch + 1, optimizer, schedule, scaler, ema, history)
            if world > 1:
                dist.barrier()

    result = TrainResult(out / CHECKPOINT, weights=EMA_ENTRY if ema is not None else "state_dict")
    if rank == 0:
        final = ema.module if ema is not None else model
        result.right = final_right if final_right is not None else evaluate(final)
        result.accuracy = top1(result.right)
        write_report(final, result.accuracy, out, title=f"HydraViT on {data.spec.source}", history=history,
                     weights=result.weights)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return result


def _save(path: Path, model: HydraViT, data: DataSplits, settings: TrainSettings, epoch: int,
          optimizer: torch.optim.Optimizer, schedule: Any, scaler: torch.amp.GradScaler, ema: Any,
          history: list[dict]) -> None:
    """The epoch's checkpoint: weights (and EMA weights, which load by default), the data's split and
    class names, and everything ``_resume`` needs to continue exactly."""
    train = training_entry(
        f"{path} ['train']", epoch=epoch, optimizer=optimizer.state_dict(), schedule=schedule.state_dict(),
        history=history, settings=settings, ema_updates=int(ema.n_averaged) if ema is not None else 0,
        scaler=scaler.state_dict() if scaler.is_enabled() else None)
    model.save(path, data=data.spec.to_dict(), classes=list(data.classes), train=train,
               **({EMA_ENTRY: ema.module.state_dict()} if ema is not None else {}))


def _resume(path: Path, model: HydraViT, optimizer: torch.optim.Optimizer, schedule: Any,
            scaler: torch.amp.GradScaler, ema: Any, settings: TrainSettings) -> tuple[int, list[dict], Any]:
    """Load a saved run's weights and state into the parts; (epochs done, history, the EMA copy).

    A run that kept no EMA weights (older, or now given --ema-decay with --override) starts its EMA
    from the resumed weights; a run of another precision starts its loss scale afresh.
    """
    saved = read_file(path)
    state = read_resume(saved, str(path)).train
    load_state(model, saved["state_dict"], f"{path} ['state_dict']")
    for part, into in (("optimizer", optimizer), ("schedule", schedule)):
        _load(into, part, getattr(state, part), path)
    if ema is not None:
        if EMA_ENTRY in saved:
            ema = ema_copy(model, settings.ema_decay, state.ema_updates)
            load_state(ema.module, saved[EMA_ENTRY], f"{path} ['{EMA_ENTRY}']")
        else:
            ema = ema_copy(model, settings.ema_decay)
    if scaler.is_enabled() and state.scaler is not None:
        _load(scaler, "scaler", state.scaler, path)
    return state.epoch, msgspec.to_builtins(state.history), ema


def write_report(model: HydraViT, accuracy: dict[int, float], out: Path, title: str,
                 history: list[dict] | None = None, stem: str = "accuracy", weights: str | None = None) -> list[dict]:
    """Write ``<stem>.json`` and ``<stem>.png`` (accuracy against GMACs, and per epoch when there is a
    history), and ``history.json`` if given.

    ``weights`` names the checkpoint entry evaluated (``checkpoint.weights_entry``), when it was read from one.
    """
    rows = accuracy_rows(model.config, accuracy)
    write_json(out / f"{stem}.json", {"config": model.config.to_dict(), "rows": rows,
                                       **({"weights": weights} if weights else {})})
    plot_accuracy({"HydraViT": rows}, out / f"{stem}.png", title, history=history)
    if history is not None:
        write_bytes(out / "history.json", history_json(history, str(out / "history.json")))
    return rows


def _load(into: Any, part: str, state: dict[str, Any], path: Path) -> None:
    """Load the checked ``part`` (optimizer, schedule or scaler) of a saved run; one that does not fit is one line."""
    try:
        into.load_state_dict(state)
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
        raise HydraEdgeError(f"{path} ['train']: $.{part}: does not fit this model's {part} ({e}); {HINT}") from None
