"""``hydra-edge eval``: accuracy per head count of a checkpoint on held-out data, printed and saved."""

from __future__ import annotations

from pathlib import Path

import click

from ..atomic import check_outputs
from ..errors import HydraEdgeError
from .base import command, ema_option, print_accuracy


@command("eval")
@click.option("--checkpoint", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--data", default=None, help="'digits', 'mnist' or a class-per-folder directory (default: the checkpoint's).")
@click.option("--heads", default=None, help="Head counts to evaluate (default: all served).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for eval.json and eval.png (default: beside the checkpoint).")
@ema_option
def evaluate(checkpoint: Path, data: str | None, heads: str | None, out: Path | None, ema: bool) -> None:
    """Accuracy per head count on held-out data, printed and saved.

    Example: hydra-edge eval --checkpoint runs/digits/checkpoint.pt --data digits
    """
    import msgspec

    from ..model.checkpoint import checkpoint_classes, load_checkpoint_file, weights_entry
    from ..model.config import parse_heads
    from ..records.training import read_data
    from ..train.data import DataSpec, load_data
    from ..train.evaluate import accuracy_per_heads
    from ..train.loop import write_report

    out = out or checkpoint.parent
    check_outputs(out / "eval.json", out / "eval.png")  # now, not after the evaluation
    model, saved = load_checkpoint_file(checkpoint, ema=ema)
    stored = read_data(saved, str(checkpoint))
    if not (stored or data):
        raise HydraEdgeError(f"{checkpoint} does not say what it was trained on; pass --data (digits or a folder)")
    spec = DataSpec.from_dict(msgspec.to_builtins(stored)) if stored else DataSpec(data)
    if data:
        spec = DataSpec(data, spec.seed, spec.val_fraction)
    served = parse_heads(heads, model.config.num_heads) if heads else model.config.heads
    classes = checkpoint_classes(saved, checkpoint, model.config.num_classes)  # labels read as the model's own
    accuracy = accuracy_per_heads(model, load_data(spec, model.config, classes).val, served)
    weights = weights_entry(saved, ema)
    print_accuracy(model.config, accuracy, f"held-out accuracy, {spec.source} ({weights})")
    write_report(model, accuracy, out, title=f"{checkpoint.name} on {spec.source}", stem="eval", weights=weights)
    click.echo(f"saved {out / 'eval.json'} and {out / 'eval.png'}")
