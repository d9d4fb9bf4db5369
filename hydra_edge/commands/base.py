"""What every ``hydra-edge`` command shares: ``-h``, ``-v`` (on the group and on each command, so
``hydra-edge -v calibrate`` and ``hydra-edge calibrate -v`` mean the same), a ``HydraEdgeError``
as one line and exit 1, Ctrl-C or SIGTERM as a plain summary and exit 130 (``Command.invoke``); the
options several commands take (``Number``, ``--ema``); the tables they print.

Commands are declared with ``@command()`` (or on the group, which makes ``Command``s), so each is
the same whether run under ``hydra-edge`` or invoked on its own (tests, ``CliRunner``).
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import click

from ..bounds import parse_number
from ..errors import HydraEdgeError
from ..logs import set_verbose
from ..runtime.terminal import restore_signals, shown, stop_on_signals
from ..transport.errors import TransportInterrupted

if TYPE_CHECKING:
    from ..model.config import HydraConfig

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
INTERRUPTED = 130  # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)
Kept = Callable[[dict[str, Any]], str]  # the command's parameters -> what an interrupted run kept


class Command(click.Command):
    """A click command whose user errors (``HydraEdgeError``) end as one ``Error:`` line, exit 1, and
    whose interruption (Ctrl-C, SIGTERM) ends as a summary of what it kept and how to go on, exit 130.

    ``kept``: what an interrupted run leaves to resume from, as a phrase (its parameters given);
    ``resume_flag``: what the command line needs added to resume (``train``'s ``--resume``).
    """

    def __init__(self, *args: Any, kept: Optional[Kept] = None, resume_flag: Optional[str] = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", CONTEXT)
        super().__init__(*args, **kwargs)
        self.params.append(verbose_option())
        self.kept, self.resume_flag = kept, resume_flag

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["hydra_edge.argv"] = list(args)  # the command line as typed: the resume line repeats it
        with plain_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        # SIGTERM (systemd's stop, kill, a supervisor's) stops a command as Ctrl-C does, so the same
        # except/finally blocks stop what it started on a device and keep what it finished; only the first
        # signal stops, so a second one cannot cut that cleanup or the summary with a traceback
        previous = stop_on_signals(once=True)
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, TransportInterrupted):  # a transport's: Ctrl-C while a device command ran
            self.interrupted(ctx)
        except HydraEdgeError as e:  # it may name a file, a class or what a device said: shown as data
            raise click.ClickException(shown(e)) from None
        finally:
            restore_signals(previous)

    def interrupted(self, ctx: click.Context) -> None:
        """Say what was kept and the command line that goes on from it, then exit 130: never a traceback,
        click's ``Aborted!`` or the device command that happened to be running."""
        argv = ctx.meta.get("hydra_edge.argv", [])
        if self.resume_flag and self.resume_flag not in argv:
            argv = [*argv, self.resume_flag]
        kept = self.kept(ctx.params) if self.kept else "nothing was left half-done"
        click.echo(shown(f"Interrupted: {kept}."), err=True)
        click.echo(shown(f"Resume with: {shlex.join(['hydra-edge', self.name or '', *argv])}"), err=True)
        ctx.exit(INTERRUPTED)


class Group(click.Group):
    """The ``hydra-edge`` group: its commands are ``Command``s, and ``-v`` shows the converters' and
    runtimes' own output on the terminal as well as in the logs (``hydra_edge.logs``)."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(verbose_option())

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with plain_usage_errors():
            return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        with plain_usage_errors():  # "No such command" repeats the word typed
            return super().resolve_command(ctx, args)


@contextmanager
def plain_usage_errors() -> Iterator[None]:
    """Click's own usage errors repeat what was typed (an option's value, an extra argument, a command
    name), which may be a file name holding terminal controls: their message is ``shown`` as data."""
    try:
        yield
    except click.ClickException as e:
        e.message = shown(e.message)
        raise


def verbose_option() -> click.Option:
    """``-v``: converters' and runtimes' own output on the terminal as well as in the logs."""
    return click.Option(["--verbose", "-v"], is_flag=True, expose_value=False, is_eager=True, callback=_verbose,
                        help="Also show what converters and runtimes print.")


def _verbose(ctx: click.Context, param: click.Parameter, on: bool) -> None:
    set_verbose(on)


def command(name: str | None = None, kept: Optional[Kept] = None,
            resume_flag: Optional[str] = None) -> Callable[[Callable[..., Any]], Command]:
    """A ``Command``; ``kept`` and ``resume_flag`` make its interruption's summary (see ``Command``)."""
    return click.command(name, cls=Command, kept=kept, resume_flag=resume_flag)


class Number(click.FloatRange):
    """A number option between two bounds, both required: ``bounds.parse_number`` (no NaN, no
    infinity, no missing top), with click's range shown in the help. ``integer``: a whole number."""

    def __init__(self, min: float, max: float, integer: bool = False, min_open: bool = False) -> None:
        super().__init__(min, max, min_open=min_open)
        self.integer = integer
        if integer:
            self.name = "integer range"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        try:
            return parse_number(value, self.min, self.max, self.integer, self.min_open)
        except ValueError as e:
            self.fail(str(e), param, ctx)


# ``--ema/--no-ema``: which weights every command that reads a checkpoint loads. A plain option, so
# declaring it imports no torch (``-h`` stays quick).
ema_option = click.option(
    "--ema/--no-ema", default=True, show_default=True,
    help="Load the checkpoint's EMA weights (state_dict_ema, model_ema) when it has them: what the official "
         "release is evaluated with. --no-ema loads its plain weights (state_dict, model).",
)


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """One rich table, numbers right-aligned: what ``info``, ``train`` and ``eval`` print."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


def print_accuracy(cfg: "HydraConfig", accuracy: dict[int, float], title: str) -> None:
    """Held-out top-1 per head count beside each subnetwork's width and GMACs."""
    from ..train.evaluate import accuracy_rows

    rows = [[str(r["heads"]), str(r["width"]), f"{r['gmacs']:.4f}", f"{r['top1']:.2f}"]
            for r in accuracy_rows(cfg, accuracy)]
    print_table(title, ["heads", "width", "GMACs", "top-1 %"], rows)
