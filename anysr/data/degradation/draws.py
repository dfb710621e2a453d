"""Helpers shared by the random draws of the degradation models (host ``numpy.random.Generator`` draws)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from anysr.errors import OptionError

__all__ = ["categorical", "check_range"]


def categorical(rng: np.random.Generator, weights: Sequence[float]) -> int:
    """Index drawn with probability proportional to ``weights`` (one uniform, as ``random.choices`` uses)."""
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)


def check_range(pair: Sequence[float], fn: str, name: str) -> tuple[float, float]:
    """``pair`` as a finite ``(low, high)`` of floats with ``low <= high``, else an OptionError naming ``fn.name``."""
    try:
        lo, hi = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise OptionError(f"{fn}: {name} must be a pair [low, high] of numbers, got {pair!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise OptionError(f"{fn}: {name} must be a finite range with low <= high, got {[lo, hi]}")
    return lo, hi
