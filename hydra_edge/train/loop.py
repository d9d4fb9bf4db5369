"""Stochastic head sampling: each batch trains one subnetwork, drawn from the served head counts.

Reads top to bottom: settings, sampling, schedule, loop. Runs in one process or under torchrun
(DDP: gloo on CPU, nccl on GPU). Every epoch ends with an atomic checkpoint holding the optimizer,
schedule and history, so ``resume`` continues exactly where an interrupted run stopped.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from ..atomic import write_json
from ..errors import HydraEdgeError
from ..model.checkpoint import read_file
from ..model.hydravit import HydraViT
from ..records.training import HEAD_SAMPLING, HINT, TrainingState, TrainSettings, read_resume
from .data import DataSplits
from .evaluate import accuracy_per_heads, accuracy_rows
from .plots import plot_accuracy

CHECKPOINT = "checkpoint.pt"
OUTPUTS = (CHECKPOINT, "history.json", "accuracy.json", "accuracy.png")  # what a run writes into its folder


# What a run is trained with, as its command-line option: a resumed run keeps its own values.
RUN_OPTIONS = {"epochs": "--epochs", "batch_size": "--batch-size", "lr": "--lr", "seed": "--seed",
               "weights": "--weights", "head_sampling": "--head-sampling"}


def refuse_change(option: str, given: Any, recorded: Any, where: Path) -> None:
    """One line for a resumed run asked to change what it was trained with, without ``--override``."""
    shown = lambda v: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    raise HydraEdgeError(f"{option} {shown(given)} differs from the run in {where}, which has {shown(recorded)}; "
                         f"drop {option} to continue the run as it was, or add --override to change it")


def resumed_settings(state: TrainingState, given: dict[str, Any], override: bool, where: Path,
                     workers: int = 0) -> TrainSettings:
    """The settings a resumed run continues with: its own (epochs, batch, lr and its schedule, seed,
    sampling weights), not the command line's defaults, which would stretch a 12-epoch schedule to 30.

    ``given`` holds only what the user typed (``RUN_OPTIONS`` names); a value that differs from the
    run's is refused unless ``override``, and so are fewer epochs than the run has trained.
    ``workers`` is this machine's choice, never the run's.
    """
    recorded = state.settings  # None: a run from before settings were kept, which takes the command line's
    run = recorded or TrainSettings()
    for name, value in given.items():
        if recorded is not None and value != getattr(recorded, name) and not override:
            refuse_change(RUN_OPTIONS[name], value, getattr(recorded, name), where)
    settings = msgspec.structs.replace(run, **given, workers=workers)
    if settings.epochs < state.epoch:
        raise HydraEdgeError(f"{where} has trained {state.epoch} epochs already; give --epochs {state.epoch} or more "
                             f"(or leave it out to finish the run's own {run.epochs})")
    return settings


@dataclass
class TrainResult:
    checkpoint: Path
    accuracy: dict[int, float] = field(default_factory=dict)  # held-out top-1 per head count (rank 0 only)


class HeadSampler:
    """Draws one head count per batch, by ``mode``; the same draws again after a resume.

    ``"per-step"``: a generator per epoch, seeded by seed and epoch, so every DDP rank runs the same
    subnetwork in a step and N ranks take the steps of one process with their whole batch.
    ``"per-rank"``: the official training script's draw: one generator per rank seeded ``seed + rank``
    (timm seeds Python's ``random`` so), running on across epochs, each draw
    ``choices(heads, weights=w / sum(w))``; ranks train different subnetworks in the same step. The
    official script shares that generator with its random-erasing augmentation, which hydra-edge
    does not have; the sequence here is the official one without those extra draws.
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


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up then cosine decay to zero (DeiT's schedule, per step)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


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


def train(
    model: HydraViT, data: DataSplits, settings: TrainSettings, out: str | Path, resume: bool = False
) -> TrainResult:
    """Train ``model`` with stochastic head sampling; write checkpoint, history and accuracy into ``out``."""
    out = Path(out)
    rank, world, device = _distributed()
    torch.manual_seed(settings.seed)
    heads = model.config.heads
    sampler = HeadSampler(heads, settings.weights, settings.seed, settings.head_sampling, rank)
    model.to(device)
    # Separate classifiers: each step trains one, so DDP must expect the others to get no gradient.
    net: nn.Module = nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=model.config.separate_heads) if world > 1 else model

    shard = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=settings.seed)
    # drop_last: every step sees a full batch, so N ranks of batch B/N take exactly the steps of one of B
    per_rank = max(1, settings.batch_size // world)
    loader = DataLoader(data.train, batch_size=per_rank, sampler=shard, num_workers=settings.workers,
                        drop_last=len(shard) >= per_rank)
    if len(loader) == 0:
        raise HydraEdgeError(f"no training images in {data.spec.source}; add images or check the folder layout")
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    total = settings.epochs * len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, settings.warmup_epochs * len(loader), total)
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)

    start, history = 0, []
    if resume and (out / CHECKPOINT).is_file():
        saved = read_file(out / CHECKPOINT)
        state = read_resume(saved, str(out / CHECKPOINT)).train
        model.load_state_dict(saved["state_dict"])
        for part, into in (("optimizer", optimizer), ("schedule", schedule)):
            _load(into, part, getattr(state, part), out / CHECKPOINT)
        start, history = state.epoch, msgspec.to_builtins(state.history)

    with _progress(rank == 0) as bar:
        task = bar.add_task("training", total=(settings.epochs - start) * len(loader))
        for epoch in range(start, settings.epochs):
            shard.set_epoch(epoch)
            rng = sampler.for_epoch(epoch, len(loader))
            net.train()
            losses, drawn = [], {k: 0 for k in heads}
            for x, y in loader:
                k = sampler.draw(rng)
                drawn[k] += 1
                loss = loss_fn(net(x.to(device), heads=k), y.to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                bar.update(task, advance=1,
                           description=f"epoch {epoch + 1}/{settings.epochs} loss {loss.item():.3f} k={k:<2}")
            if rank == 0:
                accuracy = accuracy_per_heads(model, data.val, heads)
                history.append({
                    "epoch": epoch + 1, "loss": sum(losses) / len(losses), "lr": schedule.get_last_lr()[0],
                    "drawn": drawn, "val_top1": accuracy, "world_size": world,
                })
                model.save(out / CHECKPOINT, data=data.spec.to_dict(), train={
                    "epoch": epoch + 1, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                    "history": history, "settings": msgspec.to_builtins(settings),
                })
            if world > 1:
                dist.barrier()

    result = TrainResult(out / CHECKPOINT)
    if rank == 0:
        result.accuracy = history[-1]["val_top1"] if history else accuracy_per_heads(model, data.val, heads)
        write_report(model, result.accuracy, out, title=f"HydraViT on {data.spec.source}", history=history)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return result


def write_report(model: HydraViT, accuracy: dict[int, float], out: Path, title: str,
                 history: list[dict] | None = None, stem: str = "accuracy", weights: str | None = None) -> list[dict]:
    """Write ``<stem>.json`` and ``<stem>.png`` (accuracy against GMACs), and ``history.json`` if given.

    ``weights`` names the checkpoint entry evaluated (``checkpoint.weights_entry``), when it was read from one.
    """
    rows = accuracy_rows(model.config, accuracy)
    write_json(out / f"{stem}.json", {"config": model.config.to_dict(), "rows": rows,
                                       **({"weights": weights} if weights else {})})
    plot_accuracy({"HydraViT": rows}, out / f"{stem}.png", title)
    if history is not None:
        write_json(out / "history.json", history)
    return rows


def _load(into: Any, part: str, state: dict[str, Any], path: Path) -> None:
    """Load the checked ``part`` (optimizer or schedule) of a saved run; one that does not fit is one line."""
    try:
        into.load_state_dict(state)
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
        raise HydraEdgeError(f"{path} ['train']: $.{part}: does not fit this model's {part} ({e}); {HINT}") from None
