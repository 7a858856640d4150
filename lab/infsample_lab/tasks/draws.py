"""Seeded draws the synthetic tasks share with the tiny model's corpora that train on them."""

from __future__ import annotations

import math
import random


def loguniform(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], spread evenly over orders of magnitude: as many short answers as long ones."""
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.999)))))))
