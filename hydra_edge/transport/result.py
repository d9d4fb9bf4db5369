"""What a finished device command left behind: every transport returns it, and the error for a
command that failed carries it, so it stands apart from both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """A device command's exit status and output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0
