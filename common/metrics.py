"""Run health and accuracy helpers shared by both trainers."""

from __future__ import annotations

import math

DIVERGENCE_FACTOR = 100.0


def is_diverged(loss: float, first_loss: float) -> bool:
    """A loss that is inf/nan, or has grown 100x over the first step's (a blow-up that has not yet
    overflowed: with BatchNorm a huge learning rate can stay finite for many steps)."""
    return not math.isfinite(loss) or loss > DIVERGENCE_FACTOR * max(first_loss, 1.0)
