"""Running hydra-edge commands as a test does: in this process, or as a user's process, and their errors.

A user error must end a command with exactly one ``Error:`` line and no traceback; ``one_line_error``
is that check, for every command.
"""

from __future__ import annotations

import sys

from click.testing import CliRunner, Result

from hydra_edge.commands.calibrate import calibrate


def invoke(*args: object) -> Result:
    """``hydra-edge calibrate ARGS`` in this process."""
    return CliRunner().invoke(calibrate, [str(a) for a in args])


def one_line_error(result: Result) -> str:
    """The error line of a failed command; it must be exactly one line."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: ") and len(lines[-1]) > 20, result.output
    assert not any(line.startswith("Traceback") for line in lines)
    return lines[-1]


def cli_argv(*args: object) -> list[str]:
    """The command line of ``hydra-edge ARGS`` run as its own process by this venv's Python."""
    return [sys.executable, "-m", "hydra_edge.cli", *(str(a) for a in args)]
