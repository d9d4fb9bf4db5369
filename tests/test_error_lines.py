"""A command's ``Error:`` line is one line of plain text whatever it repeats: a file name, a class
name or a word typed may hold terminal controls (a title-setting OSC, a screen clear, a newline that
forges a second ``Error:`` line), and the line shows them as escapes, never obeys them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hydra_edge.cli import main

HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\nError: forged\u202e"


def error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.parametrize("case", ["user error naming a file", "unexpected argument", "unknown command",
                                  "bad option value"])
def test_what_an_error_repeats_is_shown_as_escapes_on_one_line(tmp_path: Path, case: str) -> None:
    args = {
        "user error naming a file": ["lut", "--bundle", str(tmp_path / HOSTILE), "--calibration",
                                     str(tmp_path / "calibration.json")],
        "unexpected argument": ["info", HOSTILE],
        "unknown command": [HOSTILE],
        "bad option value": ["lut", "--budget-ms", HOSTILE],
    }[case]
    line = error_line(args)
    assert not any(c in line for c in "\x1b\x07\u202e"), repr(line)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\nError: forged\\u202e" in line, line
