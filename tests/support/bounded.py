"""Calls that must return: a test fails, instead of hanging the run, when the code under test blocks.

``within`` bounds any call; ``without_blocking`` bounds a read of a FIFO (where a record or a sysfs
attribute belongs) and releases the reader left blocked on it, so the test that failed still ends.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest

T = TypeVar("T")


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``'s result; the test fails if it has not returned after ``seconds`` (a hang, not a speed check)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert done, f"did not return within {seconds} s"
    return done[0]


def without_blocking(call: Callable[[], Any], fifo: Path, seconds: float = 5.0) -> Any:
    """``call()``'s result or the exception it raised; fails the test if it blocks on ``fifo``.

    The call runs on a thread; one still blocked after ``seconds`` is released by opening and closing the
    FIFO's write end (the blocked open then reads an empty file), so a failing test ends.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test as it is
            outcome["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"reading {fifo} blocked")
    if "error" in outcome:
        return outcome["error"]
    return outcome.get("value")
