"""The one check every number a user types goes through: finite, whole where it counts, within bounds.

Why one: ``float("nan")`` passes every comparison, ``inf`` and ``1e300`` pass a range with no top,
and ``--runs 1e13`` or ``--soak-interval inf`` then run forever. Both bounds are required here, so
an option cannot be declared without a top. Standard library only: the board app and the device
runner (argparse) use it as the host's click options do (``hydra_edge.commands.base.Number``).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Union

Num = Union[int, float]

# Bounds a host option shares with the device-side script (board app, calibration runner) it is passed to.
MAX_THREADS = 256  # runtime threads: above any board's cores, below "can't start new thread"
MAX_RUNS = 100_000  # timed or warm-up runs per head count
SOAK_INTERVAL_S = (0.1, 3600.0)  # seconds per soak sample
MAX_SOAK_S = 24 * 3600.0  # a device reaches its thermal steady state in minutes
MAX_IMAGES = 10**9
MAX_CAMERA = 1000  # OpenCV camera index
POLL_S = (0.05, 3600.0)  # seconds between signal reads on a board
WITHIN = (0.001, 1.0)  # a p90's interval as a share of it: 0.1 % is already thousands of runs
MAX_CAP_S = 24 * 3600.0  # seconds per head count, of a round's gate, of a block


def parse_number(text: Union[str, Num], low: Num, high: Num, integer: bool = False, low_open: bool = False) -> Num:
    """``text`` as a number in ``[low, high]`` (``(low, high]`` with ``low_open``); an ``int`` if ``integer``.

    Raises ``ValueError`` with a message that says what was given and what is allowed.
    """
    span = f"above {_show(low)} and at most {_show(high)}" if low_open else f"from {_show(low)} to {_show(high)}"
    allowed = f"{'a whole number' if integer else 'a number'} {span}"
    try:
        number = float(text)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{text!r} is not {allowed}") from None
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        raise ValueError(f"{text} is not {allowed}")
    if integer:
        if not number.is_integer():
            raise ValueError(f"{text} is not {allowed}")
        return int(number)
    return number


def _show(bound: Num) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def number_arg(low: Num, high: Num, integer: bool = False, low_open: bool = False) -> Callable[[str], Num]:
    """An argparse ``type=`` for ``parse_number``: a bad value is argparse's own one-line error."""

    def convert(text: str) -> Num:
        try:
            return parse_number(text, low, high, integer, low_open)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = "whole number" if integer else "number"  # argparse names the type in its messages
    return convert
