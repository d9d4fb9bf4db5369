"""Two choices judged on the same images: the interval of their difference in the share right.

Each image is right or wrong under each choice, so what carries information is the images on which
the two disagree. ``difference_interval`` is the 95 % interval of ``p_first - p_second`` by Newcombe's
hybrid score method for paired proportions (Newcombe 1998, method 10: Wilson intervals of both marginal
proportions, combined with the pair's correlation), which stays inside [-1, 1] and is sound for the
handful of discordant images a small set has. convert's gates judge an artefact's cost by it, and
train's summary whether a larger subnetwork really is less accurate than a smaller one.

Callers pass whole, non-negative counts over at least one image (the gates check what they are given).
Standard library only.
"""

from __future__ import annotations

import math
from statistics import NormalDist

CONFIDENCE = 0.95


def difference_interval(both: int, first_only: int, second_only: int, neither: int,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of ``p_first - p_second`` (as fractions) from the paired 2x2 table of images right under
    both choices, under the first only, under the second only, and under neither."""
    n = both + first_only + second_only + neither
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    l1, u1 = _wilson(both + first_only, n, z)
    l2, u2 = _wilson(both + second_only, n, z)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    # the pair's correlation with Newcombe's continuity correction, which keeps small discordant counts
    # from narrowing the interval below its level
    cross = both * neither - first_only * second_only
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0.0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    diff = p1 - p2
    low = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = diff + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, low), min(1.0, high)


def _wilson(right: int, n: int, z: float) -> tuple[float, float]:
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half
