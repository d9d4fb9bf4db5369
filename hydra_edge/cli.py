"""The ``hydra-edge`` command line: one click group, one short command per pipeline stage."""

from __future__ import annotations

from pathlib import Path

import click

from .calibrate.command import calibrate
from .convert.command import convert
from .convert.targets_command import targets
from .demo import demo
from .deploy import deploy
from .command import CONTEXT, Group, Number
from .expand import expand_command
from .errors import HydraEdgeError
from .lut.command import lut

@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="hydra-edge")
def main() -> None:
    """hydra-edge: train one HydraViT, take its subnetworks to boards and phones.

    Example: hydra-edge demo
    """


def _print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


@main.command()
@click.option("--preset", "preset_name", default=None, help="A preset: b16 or digits.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Or a checkpoint.")
def info(preset_name: str | None, checkpoint: Path | None) -> None:
    """Width, parameters, GMACs and fp32/int8 size of every subnetwork.

    Example: hydra-edge info --preset b16
    """
    from .config import preset
    from .sizes import size_table

    if checkpoint:
        from .checkpoint import load_checkpoint

        cfg, title = load_checkpoint(checkpoint).config, str(checkpoint)
    else:
        cfg, title = preset(preset_name or "b16"), f"preset {preset_name or 'b16'}"
    rows = [
        [str(s.heads), str(s.width), f"{s.params / 1e6:.2f}", f"{s.gmacs:.3f}", f"{s.fp32_mib:.1f}", f"{s.int8_mib:.1f}"]
        for s in size_table(cfg)
    ]
    _print_table(title, ["heads", "width", "params (M)", "GMACs", "fp32 MiB", "int8 MiB"], rows)


@main.command()
@click.option("--data", default="digits", show_default=True, help="'digits' (built in) or an ImageFolder directory.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/digits"), show_default=True)
@click.option("--preset", "preset_name", default=None, help="Model preset (default: digits for digits, else b16).")
@click.option("--heads", default=None, help="Head counts to sample, e.g. 3-12 or 3,6,12 (default: 3 to all).")
@click.option("--weights", default=None, help="Sampling weight per head count, e.g. 30,10,10,...")
@click.option("--separate-heads", is_flag=True, help="One classifier per head count.")
@click.option("--epochs", default=30, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--lr", default=None, type=Number(0, 10, min_open=True), help="Peak learning rate.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1))
@click.option("--init", "init_from", type=click.Path(dir_okay=False, path_type=Path),
              help="Initialise the first heads from a narrower DeiT/timm checkpoint (DeiT-tiny: heads 1-3).")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), help="Fine-tune this checkpoint.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out, with the run's own settings.")
@click.option("--override", is_flag=True, help="With --resume: let --epochs, --lr, ... change the run's settings.")
@click.option("--threads", type=click.IntRange(1, 4096), default=None,
              help="CPU threads (small models train fastest on 1).")
@click.option("--workers", default=0, show_default=True, type=click.IntRange(0, 256), help="Processes decoding images of a folder data set.")
def train(data: str, out: Path, preset_name: str | None, heads: str | None, weights: str | None,
          separate_heads: bool, epochs: int, batch_size: int, lr: float | None, seed: int,
          init_from: Path | None, checkpoint: Path | None, resume: bool, override: bool, threads: int | None,
          workers: int) -> None:
    """Train HydraViT with stochastic head sampling; writes checkpoint, history and accuracy per head count.

    Example: hydra-edge train --data digits --out runs/digits --epochs 30
    """
    from dataclasses import replace

    import torch

    from .checkpoint import init_heads_from, load_checkpoint, load_checkpoint_file
    from .config import parse_heads, preset
    from .data import DataSpec, data_classes, load_data
    from .model import HydraViT
    from .train import CHECKPOINT, RUN_OPTIONS, TrainSettings, refuse_change, resumed_settings, train as run_training

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)  # the same initial weights on every run and every DDP rank
    previous = out / CHECKPOINT
    shaping = [flag for flag, given in (("--preset", preset_name), ("--heads", heads), ("--init", init_from),
                                        ("--separate-heads", separate_heads)) if given]
    if previous.is_file() and not resume:
        raise HydraEdgeError(f"{out} already holds a training run; pass --resume to continue it "
                             "or choose another --out")
    if checkpoint and shaping:
        raise HydraEdgeError(f"--checkpoint fine-tunes the model as saved; drop {', '.join(shaping)}")
    settings = TrainSettings(
        epochs=epochs, batch_size=batch_size, seed=seed, workers=workers,
        weights=_integers(weights, "--weights") if weights else None,
        **({"lr": lr} if lr is not None else {}),
    )
    spec = DataSpec(data, seed=seed)
    if resume and previous.is_file():
        model, saved = load_checkpoint_file(previous)  # the run's own config, settings and data
        recorded = (saved.get("train") or {}).get("settings")
        if recorded:
            given = {name: getattr(settings, name) for name in _typed(RUN_OPTIONS)}
            settings = resumed_settings(recorded, given, override, previous, workers)
        if isinstance(saved.get("data"), dict):
            spec = DataSpec.from_dict(saved["data"])
            if _typed({"data": "--data"}) and data != spec.source:
                if not override:
                    refuse_change("--data", data, spec.source, previous)
                spec = replace(spec, source=data)
    elif checkpoint:
        model = load_checkpoint(checkpoint)
    else:
        name = preset_name or ("digits" if data == "digits" else "b16")
        cfg = preset(name, num_classes=len(data_classes(data)))
        served = parse_heads(heads, cfg.num_heads) if heads else cfg.heads
        model = HydraViT(replace(cfg, heads=served, separate_heads=separate_heads))
        if init_from:
            k = init_heads_from(model, init_from)
            click.echo(f"initialised heads 1-{k} from {init_from}")
    result = run_training(model, load_data(spec, model.config), settings, out, resume=resume)
    if result.accuracy:
        _print_accuracy(model.config, result.accuracy, f"held-out accuracy, {data}")
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


def _print_accuracy(cfg, accuracy: dict[int, float], title: str) -> None:
    from .evaluate import accuracy_rows

    rows = [[str(r["heads"]), str(r["width"]), f"{r['gmacs']:.4f}", f"{r['top1']:.2f}"] for r in accuracy_rows(cfg, accuracy)]
    _print_table(title, ["heads", "width", "GMACs", "top-1 %"], rows)


@main.command("eval")
@click.option("--checkpoint", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--data", default=None, help="'digits' or an ImageFolder directory (default: the checkpoint's).")
@click.option("--heads", default=None, help="Head counts to evaluate (default: all served).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for eval.json and eval.png (default: beside the checkpoint).")
def evaluate(checkpoint: Path, data: str | None, heads: str | None, out: Path | None) -> None:
    """Accuracy per head count on held-out data, printed and saved.

    Example: hydra-edge eval --checkpoint runs/digits/checkpoint.pt --data digits
    """
    from .checkpoint import load_checkpoint_file
    from .config import parse_heads
    from .data import DataSpec, load_data
    from .evaluate import accuracy_per_heads
    from .train import write_report

    model, saved = load_checkpoint_file(checkpoint)
    stored = saved.get("data")
    if not (stored or data):
        raise HydraEdgeError(f"{checkpoint} does not say what it was trained on; pass --data (digits or a folder)")
    spec = DataSpec.from_dict(stored) if stored else DataSpec(data)
    if data:
        spec = DataSpec(data, spec.seed, spec.val_fraction)
    served = parse_heads(heads, model.config.num_heads) if heads else model.config.heads
    accuracy = accuracy_per_heads(model, load_data(spec, model.config).val, served)
    _print_accuracy(model.config, accuracy, f"held-out accuracy, {spec.source}")
    out = out or checkpoint.parent
    write_report(model, accuracy, out, title=f"{checkpoint.name} on {spec.source}", stem="eval")
    click.echo(f"saved {out / 'eval.json'} and {out / 'eval.png'}")


for command in (convert, expand_command, calibrate, lut, deploy, demo):
    main.add_command(command)
main.add_command(targets)


if __name__ == "__main__":  # torchrun --nproc_per_node N -m hydra_edge.cli train ...
    main()
