"""``hydra-edge train``: build or load the model, then train it with stochastic head sampling (``train``)."""

from __future__ import annotations

from pathlib import Path

import click

from ..atomic import check_outputs
from ..errors import HydraEdgeError
from ..model.vit import INIT_SCHEMES
from ..records.training import HEAD_SAMPLING, MAX_BATCH, MAX_EPOCHS, MAX_LR, MAX_SEED, MAX_WORKERS
from .base import Number, command, ema_option, print_accuracy

EPOCHS = Number(1, MAX_EPOCHS, integer=True)  # the bound a checkpoint's training state is read with; demo's too


@command()
@click.option("--data", default="digits", show_default=True, help="'digits' (built in) or an ImageFolder directory.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/digits"), show_default=True)
@click.option("--preset", "preset_name", default=None, help="Model preset (default: digits for digits, else b16).")
@click.option("--heads", default=None, help="Head counts to sample, e.g. 3-12 or 3,6,12 (default: 3 to all).")
@click.option("--weights", default=None, help="Sampling weight per head count, e.g. 30,10,10,...")
@click.option("--head-sampling", type=click.Choice(HEAD_SAMPLING), default="per-step", show_default=True,
              help="per-step: one head count per step, the same on every DDP rank; per-rank: each rank draws its "
                   "own from a generator seeded seed + rank, as the official training script does.")
@click.option("--separate-heads", is_flag=True, help="One classifier per head count.")
@click.option("--init-scheme", type=click.Choice(INIT_SCHEMES), default="timm", show_default=True,
              help="timm: truncated-normal linears (std 0.02), zero biases; torch-default: the linears keep "
                   "PyTorch's own initialisation, as in the official code.")
@click.option("--epochs", default=30, show_default=True, type=EPOCHS)
@click.option("--batch-size", default=32, show_default=True, type=Number(1, MAX_BATCH, integer=True))
@click.option("--lr", default=None, type=Number(0, MAX_LR, min_open=True), help="Peak learning rate.")
@click.option("--seed", default=0, show_default=True, type=Number(0, MAX_SEED, integer=True))
@click.option("--init", "init_from", type=click.Path(dir_okay=False, path_type=Path),
              help="Initialise the first heads from a narrower DeiT/timm checkpoint (DeiT-tiny: heads 1-3).")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Fine-tune this checkpoint.")
@ema_option
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out, with the run's own settings.")
@click.option("--override", is_flag=True, help="With --resume: let --epochs, --lr, ... change the run's settings.")
@click.option("--threads", type=Number(1, 4096, integer=True), default=None,
              help="CPU threads (small models train fastest on 1).")
@click.option("--workers", default=0, show_default=True, type=Number(0, MAX_WORKERS, integer=True),
              help="Processes decoding images of a folder data set.")
def train(data: str, out: Path, preset_name: str | None, heads: str | None, weights: str | None,
          head_sampling: str, separate_heads: bool, init_scheme: str, epochs: int, batch_size: int,
          lr: float | None, seed: int, init_from: Path | None, checkpoint: Path | None, ema: bool, resume: bool,
          override: bool, threads: int | None, workers: int) -> None:
    """Train HydraViT with stochastic head sampling; writes checkpoint, history and accuracy per head count.

    Example: hydra-edge train --data digits --out runs/digits --epochs 30
    """
    from dataclasses import replace

    import msgspec
    import torch

    from ..model.checkpoint import init_heads_from, load_checkpoint, load_checkpoint_file
    from ..model.config import parse_heads, preset
    from ..model.hydravit import HydraViT
    from ..records.training import read_resume
    from ..train.data import DataSpec, data_classes, load_data
    from ..train.loop import CHECKPOINT, OUTPUTS, RUN_OPTIONS, TrainSettings, refuse_change, resumed_settings
    from ..train.loop import train as run_training

    check_outputs(*(out / name for name in OUTPUTS))  # now, not after the first epoch
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)  # the same initial weights on every run and every DDP rank
    previous = out / CHECKPOINT
    shaping = [flag for flag, given in (("--preset", preset_name), ("--heads", heads), ("--init", init_from),
                                        ("--separate-heads", separate_heads),
                                        ("--init-scheme", "init_scheme" in _typed({"init_scheme": "--init-scheme"})))
               if given]
    if previous.is_file() and not resume:
        raise HydraEdgeError(f"{out} already holds a training run; pass --resume to continue it "
                             "or choose another --out")
    if checkpoint and shaping:
        raise HydraEdgeError(f"--checkpoint fine-tunes the model as saved; drop {', '.join(shaping)}")
    settings = TrainSettings(
        epochs=epochs, batch_size=batch_size, seed=seed, workers=workers, head_sampling=head_sampling,
        init_scheme=init_scheme, weights=_integers(weights, "--weights") if weights else None,
        **({"lr": lr} if lr is not None else {}),
    )
    spec = DataSpec(data, seed=seed)
    if resume and previous.is_file():
        model, saved = load_checkpoint_file(previous)  # the run's own config, settings and data
        state = read_resume(saved, str(previous))  # checked whole, before anything trains
        given = {name: getattr(settings, name) for name in _typed(RUN_OPTIONS)}
        settings = resumed_settings(state.train, given, override, previous, workers)
        if state.data is not None:
            spec = DataSpec.from_dict(msgspec.to_builtins(state.data))
            if _typed({"data": "--data"}) and data != spec.source:
                if not override:
                    refuse_change("--data", data, spec.source, previous)
                spec = replace(spec, source=data)
    elif checkpoint:
        model = load_checkpoint(checkpoint, ema=ema)
    else:
        name = preset_name or ("digits" if data == "digits" else "b16")
        cfg = preset(name, num_classes=len(data_classes(data)))
        served = parse_heads(heads, cfg.num_heads) if heads else cfg.heads
        model = HydraViT(msgspec.structs.replace(cfg, heads=served, separate_heads=separate_heads), init_scheme=init_scheme)
        if init_from:
            k = init_heads_from(model, init_from, ema=ema)
            click.echo(f"initialised heads 1-{k} from {init_from}")
    result = run_training(model, load_data(spec, model.config), settings, out, resume=resume)
    if result.accuracy:
        print_accuracy(model.config, result.accuracy, f"held-out accuracy, {data}")
        click.echo(f"checkpoint: {result.checkpoint}\nreport: {out / 'accuracy.json'}, {out / 'accuracy.png'}")


def _typed(names: dict[str, str]) -> set[str]:
    """Which of these parameters the user set (command line or environment), as opposed to defaults."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {name for name in names if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)}


def _integers(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise HydraEdgeError(f"{option} {text!r}: give comma-separated integers, e.g. 40,20,20,20") from None
