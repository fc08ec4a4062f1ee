"""Summaries of timed samples: median and spread, never a mean alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, min, max and count of ``samples`` (seconds or any unit)."""
    if len(samples) == 0:
        raise ValueError("no timed samples to summarize")
    values = np.asarray(samples, dtype=np.float64)
    return {
        "median": float(np.median(values)),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
        "min": float(values.min()),
        "max": float(values.max()),
        "n": int(len(values)),
    }
