"""``hydra-edge convert``: the click command; the work is in ``pipeline``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..convert.layout import LAYOUTS
from ..convert.options import ConvertOptions, ConvertResult
from ..convert.pipeline import convert_targets, targets_options
from ..logs import LOGS, terminal
from .base import Number, command, ema_option

JOBS = Number(1, 256, integer=True)  # conversion processes; demo passes its own through


class _Progress:
    """A rich progress display, one row per artefact: file, stage, seconds, size."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=12), TextColumn("{task.fields[stage]}"),
            TimeElapsedColumn(), TextColumn("{task.fields[size]}"), console=Console(file=terminal()),
        )
        self.rows: dict[str, int] = {}

    def __call__(self, file: str, stage: str, size: int | None) -> None:
        if file not in self.rows:
            self.rows[file] = self.progress.add_task(file, total=1, stage=stage, size="")
        final = stage == "done" or stage.startswith(("skipped", "FAILED"))
        self.progress.update(self.rows[file], stage=stage, completed=1 if final else 0,
                             size=f"{size / 2**20:.2f} MiB" if size else "")
        if final:
            self.progress.stop_task(self.rows[file])


class _LogLines:
    """Without a terminal (CI, pipes): one line per finished artefact instead of a live display.

    The compact layout reports an artefact a second time once it is rebuilt against the largest
    head count's weights; that second list has its own heading and says "compacted", so a log does
    not read as every artefact converted twice.
    """

    def __init__(self) -> None:
        self.compacting: set[str] = set()

    def __call__(self, file: str, stage: str, size: int | None) -> None:
        if stage == "compact":
            if not self.compacting:
                click.echo("compacting against the largest head count's weights (one weight set):", file=terminal())
            self.compacting.add(file)
            return
        if stage == "done" and file in self.compacting:
            stage = "compacted"
        if stage in ("done", "compacted") or stage.startswith(("skipped", "FAILED")):
            click.echo(f"{file}: {stage}" + (f" ({size / 2**20:.2f} MiB)" if size else ""), file=terminal())


def _note(line: str) -> None:
    click.echo(line, file=terminal())


def _summary(result: ConvertResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.out}/manifest.json")
    for col in ("artefact", "MiB", "top-1 %", "fp32 %", "drop p.p. [95 %]", "nested", "agree %", "convert s", "verify s"):
        table.add_column(col, justify="left" if col == "artefact" else "right")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    by_logits = False
    for a in result.manifest.artefacts:
        acc, nesting = a.accuracy, a.nesting
        drop = fmt(acc["drop_pp"], ".2f")
        if acc.get("evidence"):
            e = acc["evidence"]
            drop = f"{e['cost_pp']:+.2f} [{e['low_pp']:+.1f},{e['high_pp']:+.1f}]" + ("*" if e["decided_by"] == "logits" else "")
            by_logits |= e["decided_by"] == "logits"
        nested = "-" if nesting is None else "yes" if nesting.nested else "no"
        if nesting is not None and nesting.evidence is not None:
            nested += f" {nesting.evidence.logit_cost_pp:+.2f}" + ("*" if nesting.evidence.decided_by == "logits" else "")
            by_logits |= nesting.evidence.decided_by == "logits"
        table.add_row(a.file, f"{a.bytes / 2**20:.2f}", fmt(acc["top1"], ".2f"), fmt(acc["fp32_top1"], ".2f"), drop,
                      nested, f"{acc['agreement']:.1f}", f"{a.convert_seconds:.1f}", fmt(a.verify_seconds, ".1f"))
    # Piped or logged, rich would wrap to 80 columns and cut the file names: print the table whole.
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    if by_logits:
        click.echo("* the held-out images could not tell the cost from noise (its 95 % interval spans the bound): "
                   "decided by the cost the logits' error predicts (nested: that predicted cost, in p.p.)")
    click.echo(f"{len(result.converted)} converted, {len(result.skipped)} unchanged, {len(result.failed)} failed")
    if result.converted or result.failed:
        click.echo(f"converter output: {result.out / LOGS}")


@command(kept=lambda params: f"every artefact finished is kept in {params['out']} and listed in its manifest; "
                            "the rest are converted when it resumes")
@click.option("--checkpoint", "-c", required=True, type=click.Path(path_type=Path), envvar="HYDRA_EDGE_CHECKPOINT",
              help="HydraViT checkpoint (hydra-edge, official release or timm layout).")
@click.option("--target", "-t", "targets", required=True, multiple=True,
              help="Profile name in targets/ (rpi, jetson, android) or a .toml path. Several (-t rpi -t jetson, "
                   "or -t rpi,jetson) convert in one run, sharing the fp32 references: one bundle each, "
                   "in --out/<target name>/.")
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path),
              help="Bundle folder to write (with several targets: the folder of their bundles).")
@click.option("--heads", default=None, help="Head counts: 3-12 or 3,6,12 (default: every one the checkpoint serves).")
@click.option("--quant", default=None, help="Override the profile's quantisation (e.g. fp32, int8-dynamic).")
@click.option("--max-drop", default=1.0, show_default=True, type=Number(0, 100),
              help="Fail an artefact whose top-1 falls more than this many p.p. below fp32, on the evidence: beyond "
                   "noise on the held-out images, or, where they are too few to tell, by the drop its logits' error "
                   "predicts.")
@click.option("--jobs", "-j", default=None, type=JOBS,
              help="Convert artefacts in this many parallel processes (default: as many as the cores and the "
                   "available memory hold; the progress output says how many).")
@click.option("--data", default=None, help="Verify on this data ('digits' or a folder) instead of the checkpoint's.")
@click.option("--eval-limit", default=1000, show_default=True, type=Number(1, 10_000_000, integer=True),
              help="Held-out images per artefact check.")
@click.option("--optional", is_flag=True, help="Also convert the profile's optional artefacts.")
@click.option("--force", is_flag=True, help="Re-convert artefacts even when nothing changed.")
@click.option("--layout", type=click.Choice(LAYOUTS), default="compact", show_default=True,
              help="compact: the largest head count's artefact whole, every other one as a skeleton and a recipe "
                   "that rebuild it from those weights (formats that cannot, full files with a note); "
                   "full: one file each.")
@ema_option
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
@click.option("--no-wait", is_flag=True, help="If another run is writing --out, stop (naming it) instead of waiting.")
def convert(checkpoint: Path, targets: tuple[str, ...], out: Path, heads: str | None, quant: str | None,
            max_drop: float, jobs: int | None, data: str | None, eval_limit: int, optional: bool, force: bool, layout: str,
            ema: bool, quiet: bool, no_wait: bool) -> None:
    """Convert each subnetwork to the target's artefacts, verify them, write a manifest.

    Re-running is incremental: unchanged artefacts are skipped, an interrupted run resumes.
    Each head count's fp32 reference logits are computed once, batched, and shared by every
    variant and every target of the run: converting several targets together costs little more
    than their exports.

    \b
    Example:
      hydra-edge convert -c runs/digits/checkpoint.pt --target rpi --out bundles/rpi
      hydra-edge convert -c model.pt -t rpi,android,jetson --out bundles   # bundles/rpi, bundles/android, ...
      hydra-edge convert -c model.pt --target jetson --heads 3,6,12 --jobs 2 --out bundles/jetson
      hydra-edge convert -c model.pt --target jetson --quant fp16 --layout full --out bundles/jetson-files
    """
    opts = ConvertOptions(checkpoint=checkpoint, target="", out=out, heads=heads, quant=quant, max_drop=max_drop,
                          jobs=jobs, data=data, eval_limit=eval_limit, optional=optional, force=force,
                          wait=not no_wait, layout=layout, ema=ema)
    runs = targets_options(opts, targets)
    note = (lambda line: None) if quiet else _note
    progress = None if quiet or not sys.stderr.isatty() else _Progress()
    if progress:
        with progress.progress:
            results = convert_targets(runs, progress, progress.progress.console.print)
    else:
        results = convert_targets(runs, _LogLines(), note)
    for result in results:
        _summary(result)
    failed = [line for result in results for line in result.failed]
    if failed:
        raise click.ClickException("; ".join(failed))
