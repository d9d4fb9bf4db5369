"""``hydra-edge train``: build or load the model, then train it with stochastic head sampling (``train``).

The training settings are a named recipe (``train.recipe.RECIPES``) with one option per setting;
a value typed on the command line always wins over the recipe's. The options are made from the
settings' schema (``records.training.TrainSettings``), so their bounds are the ones a checkpoint's
settings are read with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import click
import msgspec

from ..atomic import check_outputs
from ..errors import HydraEdgeError
from ..model.vit import INIT_SCHEMES
from ..records.training import MAX_EPOCHS, MAX_WORKERS, SETTINGS_HELP, TrainSettings, setting_flag
from ..train.recipe import RECIPES
from .base import Number, command, ema_option, print_accuracy

EPOCHS = Number(1, MAX_EPOCHS, integer=True)  # the bound a checkpoint's training state is read with; demo's too

class Bounded(Number):
    """``Number`` that may also exclude its top (a schema's ``lt``)."""

    def __init__(self, min: float, max: float, integer: bool = False, min_open: bool = False,
                 max_open: bool = False) -> None:
        super().__init__(min, max, integer=integer, min_open=min_open)
        self.max_open = max_open

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        number = super().convert(value, param, ctx)
        if self.max_open and number >= self.max:
            self.fail(f"{value} is not a number below {self.max:g}", param, ctx)
        return number


def _setting_option(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The option of setting ``name``: a flag pair for a bool, a choice for a literal, else a bounded number;
    unset (None) unless typed, so the recipe's value stands."""
    kind = next(f.type for f in msgspec.inspect.type_info(TrainSettings).fields if f.name == name)
    default = "off" if name == "compile" else "the recipe's"  # compiling is this machine's choice, in no recipe
    flag, help_ = setting_flag(name), f"{SETTINGS_HELP[name]} [default: {default}]"
    if isinstance(kind, msgspec.inspect.BoolType):
        return click.option(flag, name, default=None, help=help_)
    if isinstance(kind, msgspec.inspect.LiteralType):
        return click.option(flag, name, type=click.Choice(kind.values), default=None, help=help_)
    low, high = (kind.ge if kind.gt is None else kind.gt), (kind.le if kind.lt is None else kind.lt)
    return click.option(flag, name, default=None, help=help_, type=Bounded(
        low, high, integer=isinstance(kind, msgspec.inspect.IntType), min_open=kind.gt is not None,
        max_open=kind.lt is not None))


def setting_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per ``SETTINGS_HELP`` entry (records.training), in its order."""
    for name in reversed(SETTINGS_HELP):
        f = _setting_option(name)(f)
    return f


@command(kept=lambda params: _kept(params["out"]), resume_flag="--resume")
@click.option("--data", default="digits", show_default=True, help="Built in: 'digits' (8x8) or 'mnist' (5000 images, 28x28); or a folder with a sub-folder of images per class.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/digits"), show_default=True)
@click.option("--val-fraction", type=Bounded(0, 1, min_open=True, max_open=True), default=None,
              help="Share of the images held out for validation, when the data has no val/ folder [default: 0.2].")
@click.option("--preset", "preset_name", default=None, help="Model preset (default: digits for digits, else b16).")
@click.option("--heads", default=None, help="Head counts to sample, e.g. 3-12 or 3,6,12 (default: 3 to all).")
@click.option("--weights", default=None, help="Sampling weight per head count, e.g. 30,10,10,...")
@click.option("--separate-heads", is_flag=True, help="One classifier per head count.")
@click.option("--init-scheme", type=click.Choice(INIT_SCHEMES), default="timm", show_default=True,
              help="timm: truncated-normal linears (std 0.02), zero biases; torch-default: the linears keep "
                   "PyTorch's own initialisation, as in the official code.")
@click.option("--init", "init_from", type=click.Path(dir_okay=False, path_type=Path),
              help="Initialise the first heads from a narrower DeiT/timm checkpoint (DeiT-tiny: heads 1-3).")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Fine-tune this checkpoint.")
@ema_option
@click.option("--recipe", default=None,
              help=f"Training recipe: {', '.join(RECIPES)} (docs/training.md). Default: finetune with --checkpoint "
                   "or --init on a folder; from new weights, digits on the digits preset, else scratch.")
@setting_options
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out, with the run's own settings.")
@click.option("--override", is_flag=True, help="With --resume: let --epochs, --lr, ... change the run's settings.")
@click.option("--threads", type=Number(1, 4096, integer=True), default=None,
              help="CPU threads (default: 1 for a small model, else the cores other processes leave free).")
@click.option("--workers", default=None, type=Number(0, MAX_WORKERS, integer=True),
              help="Processes decoding images of a folder (default: up to 8 on a GPU, half the cores on a CPU).")
def train(data: str, out: Path, val_fraction: float | None, preset_name: str | None, heads: str | None,
          weights: str | None, separate_heads: bool, init_scheme: str, init_from: Path | None,
          checkpoint: Path | None, ema: bool, recipe: str | None, resume: bool, override: bool,
          threads: int | None, workers: int | None, **options: Any) -> None:
    """Train HydraViT with stochastic head sampling; writes checkpoint, history and accuracy per head count.

    Example: hydra-edge train --data digits --out runs/digits --epochs 30

    Fine-tune a checkpoint on a folder: hydra-edge train --data photos/ --checkpoint model.pt --recipe finetune
    """
    import os
    from msgspec.structs import replace

    import torch

    from ..model.checkpoint import checkpoint_classes, load_checkpoint_file
    from ..model.config import parse_heads, preset
    from ..model.hydravit import HydraViT
    from ..records.training import read_resume
    from ..train.advice import before_training, falls_line, recorded_accuracy
    from ..train.data import BUILT_IN, DataSpec, data_classes, load_data
    from ..train.loop import CHECKPOINT, OUTPUTS, cpu_threads, refuse_change, resumed_settings
    from ..train.loop import train as run_training
    from ..train.recipe import autocast_dtype, default_recipe, settings_for
    from ..train.transfer import fit_classes, init_first_heads

    check_outputs(*(out / name for name in OUTPUTS))  # now, not after the first epoch
    machine = {"workers": workers, "compile": bool(options.pop("compile"))}
    typed = {name: value for name, value in options.items() if value is not None}
    if weights:
        typed["weights"] = _integers(weights, "--weights")
    if recipe is not None:
        typed["recipe"] = recipe
    previous = out / CHECKPOINT
    base = None  # (path, recorded accuracy, classes) of a --checkpoint, for the lines said before training
    shaping = [flag for flag, given in (("--preset", preset_name), ("--heads", heads), ("--init", init_from),
                                        ("--separate-heads", separate_heads),
                                        ("--init-scheme", "init_scheme" in _typed({"init_scheme": "--init-scheme"})))
               if given]
    if previous.is_file() and not resume:
        raise HydraEdgeError(f"{out} already holds a training run; pass --resume to continue it "
                             "or choose another --out")
    if checkpoint and shaping:
        raise HydraEdgeError(f"--checkpoint fine-tunes the model as saved; drop {', '.join(shaping)}")
    if resume and previous.is_file():
        model, saved = load_checkpoint_file(previous, ema=False)  # the run's own config, settings and data
        state = read_resume(saved, str(previous))  # checked whole, before anything trains
        settings = resumed_settings(state.train, typed, override, previous, machine)
        spec = DataSpec(data, seed=settings.seed)
        if state.data is not None:
            spec = DataSpec.from_dict(msgspec.to_builtins(state.data))
        for option, name, given in (("--data", "source", data if _typed({"data": "--data"}) else None),
                                    ("--val-fraction", "val_fraction", val_fraction)):
            if given is not None and given != getattr(spec, name):
                if not override:
                    refuse_change(option, given, getattr(spec, name), previous)
                spec = replace(spec, **{name: given})
    else:
        default = default_recipe(data, preset_name, pretrained=bool(checkpoint or init_from))
        settings = settings_for(typed.pop("recipe", default), init_scheme=init_scheme, **typed, **machine)
        spec = DataSpec(data, seed=settings.seed, **({"val_fraction": val_fraction} if val_fraction else {}))
        torch.manual_seed(settings.seed)  # the same initial weights on every run and every DDP rank
        classes = data_classes(data)
        if checkpoint:  # the backbone transfers; a classifier for other classes is replaced, and said so
            model, saved = load_checkpoint_file(checkpoint, ema=ema)
            base = (checkpoint, recorded_accuracy(saved, ema), model.config.num_classes)
            note = fit_classes(model, classes, checkpoint_classes(saved, checkpoint, model.config.num_classes),
                               checkpoint)
            if note:
                click.echo(note)
        else:
            name = preset_name = preset_name or ("digits" if data in BUILT_IN else "b16")
            cfg = preset(name, num_classes=len(classes))
            served = parse_heads(heads, cfg.num_heads) if heads else cfg.heads
            model = HydraViT(msgspec.structs.replace(cfg, heads=served, separate_heads=separate_heads),
                             init_scheme=init_scheme)
            if init_from:
                click.echo(init_first_heads(model, init_from, classes, ema=ema))
    autocast_dtype(settings.precision, torch.device("cuda" if torch.cuda.is_available() else "cpu"))  # before the data
    if threads:
        torch.set_num_threads(threads)
    elif not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cpu_threads(model.config, settings.batch_size))
    known = checkpoint_classes(saved, previous, model.config.num_classes) if resume and previous.is_file() else None
    split = load_data(spec, model.config, known)
    if not (resume and previous.is_file()):  # a resumed run was told when it started
        for line in before_training(settings=settings, model=model, source=spec.source, images=len(split.train),
                                    base=base, preset_name=preset_name, cpu=not torch.cuda.is_available()):
            click.echo(line)
    result = run_training(model, split, settings, out, resume=resume)
    if result.accuracy:
        weights_kind = "EMA weights" if result.weights != "state_dict" else "weights"
        print_accuracy(model.config, result.accuracy, f"held-out accuracy of the {weights_kind}, {spec.source}")
        falls = falls_line(result.right)
        if falls:
            click.echo(falls)
        click.echo(f"checkpoint: {result.checkpoint}\nreport: {out / 'accuracy.json'}, {out / 'accuracy.png'}")


def _kept(out: Path) -> str:
    """What an interrupted run leaves in ``out``: the checkpoint of its last finished epoch, which
    ``--resume`` continues exactly, or nothing yet (``--resume`` then starts the run afresh)."""
    from ..train.loop import CHECKPOINT

    checkpoint = out / CHECKPOINT
    if checkpoint.is_file():
        return f"the checkpoint of the last finished epoch is kept in {checkpoint}"
    return f"no epoch had finished, so {out} holds nothing to go on from; the run starts again"


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
