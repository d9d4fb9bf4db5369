"""Command-line values the int8 benches share, checked when parsed so that a typo fails before
minutes of export. Torch-free: a host that only times artefacts parses them too."""

from __future__ import annotations

import argparse

FC_SHAPE = "197x3072x3072"  # the FC layer that sets a runtime's int8 rate: a b16 MLP layer's rows and widths


def positive_list(text: str) -> list[int]:
    """``1,8``: positive integers, sorted, each once."""
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive integers, e.g. 1,8")
    return sorted({int(p) for p in parts})


def fc_shape(text: str) -> str:
    """``TOKENSxINxOUT``: three positive integers (the text as given, which reports name the layer by)."""
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not TOKENSxINxOUT, e.g. {FC_SHAPE}")
    return text
