"""Whether a technique kept the accuracy, judged against the baseline's spread over repeats; and time to accuracy.

A speed-up that costs accuracy is no speed-up, but two repeats of one configuration already differ by their
run-to-run noise (data order is seeded, yet fp32 rounding makes the trajectories drift apart): so a rung has
"lost" accuracy only when its mean is below the baseline's mean by more than that noise, taken as twice the
baseline's sample standard deviation over repeats, and never less than one point (0.01) so that a baseline whose
repeats happen to agree does not make every rounding difference a loss.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from common.results import RunResult

NAN = float("nan")
FLOOR = 0.01  # the smallest tolerance, in accuracy (one point)
SPREADS = 2.0  # tolerance in baseline standard deviations
INTACT, LOST, NO_RESULT, NO_BASELINE = "intact", "lost", "no result", "no baseline"
NO_SPREAD = " (no spread: 1 repeat)"  # appended when the baseline has one repeat, so only the floor judges


@dataclass(frozen=True)
class Verdict:
    """A rung's accuracy against the baseline's. ``label`` is intact or lost (with NO_SPREAD appended when the
    baseline ran once), "no result" when the rung has no finished repeat, "no baseline" when the baseline has
    none."""

    label: str
    mean: float  # the rung's mean final accuracy over its finished repeats
    std: float  # their sample standard deviation (NaN with fewer than two)
    n: int  # finished repeats of the rung
    delta: float  # the rung's mean minus the baseline's mean (negative: lower)
    tolerance: float  # how far below the baseline's mean the rung's may be and still be intact
    baseline_mean: float = NAN
    baseline_n: int = 0

    @property
    def lost(self) -> bool:
        return self.label.startswith(LOST)

    @property
    def text(self) -> str:
        """One table cell: the label and, where judged, the change against the tolerance."""
        if not math.isfinite(self.delta):
            return self.label
        return f"{self.label}: {self.delta:+.3f} (tolerance {self.tolerance:.3f})"


def verdict(baseline: Sequence[float], rung: Sequence[float]) -> Verdict:
    """The rung's final accuracies (one per finished repeat) judged against the baseline's; NaN values (a run
    without an evaluation) are left out."""
    base, own = _finished(baseline), _finished(rung)
    mean, std = _mean_std(own)
    if not own:
        return Verdict(NO_RESULT, NAN, NAN, 0, NAN, NAN, _mean_std(base)[0], len(base))
    if not base:
        return Verdict(NO_BASELINE, mean, std, len(own), NAN, NAN)
    base_mean, base_std = _mean_std(base)
    tolerance = max(SPREADS * base_std, FLOOR) if len(base) > 1 else FLOOR
    delta = mean - base_mean
    label = (LOST if delta < -tolerance else INTACT) + ("" if len(base) > 1 else NO_SPREAD)
    return Verdict(label, mean, std, len(own), delta, tolerance, base_mean, len(base))


def time_to_target(result: RunResult, target: float) -> tuple[float, float] | None:
    """(seconds from the process's start, seconds of training steps) at the first evaluation whose accuracy
    reaches ``target``; None when none did. A row written before these were measured gives (NaN, NaN): reached,
    at an unknown time."""
    hit = next((e for e in result.evals if e.accuracy >= target), None)
    return None if hit is None else (hit.elapsed_s, hit.train_s)


def _finished(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1: the repeats are a sample of the run-to-run noise)."""
    if not values:
        return NAN, NAN
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else NAN


CHANCE_SPREADS = 2.0  # an accuracy within this many binomial standard errors of 1/classes is at chance


def at_chance(accuracy: float, classes: int | None, samples: int | None) -> bool:
    """Whether ``accuracy`` over ``samples`` examples is indistinguishable from guessing among ``classes``: within
    CHANCE_SPREADS standard errors of 1/classes (a model that learnt nothing scores that, give or take its noise),
    or below it. Unknown (an old row without its class count): False."""
    if not classes or not samples or classes < 2:
        return False
    chance = 1.0 / classes
    return accuracy <= chance + CHANCE_SPREADS * math.sqrt(chance * (1 - chance) / samples)
