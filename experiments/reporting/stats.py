"""Intervals and verdicts that noise cannot fake: pure numbers in, estimates with 95% intervals and one of three
verdicts out (no run, row or framework known here).

Runs are the unit of replication. A run (one process) is summarised by one value, its median step time (or its
time to accuracy, or its latency); the steps inside a run are not independent of each other (they share the
process's compile, caches, allocator and the machine's mood at that minute), so they never count as samples of
the configuration. A configuration's estimate is the geometric mean of its runs' values, and its interval a
Student t interval on their logarithms:

- Logarithms, because step times vary by factors (a slow minute makes every step 1.3x, not 30 ms, slower), and a
  ratio of two configurations is then a difference of two means.
- t, not a bootstrap: with the 2-5 runs a configuration gets, resampling runs sees only a handful of distinct
  resamples, and its percentile interval covers the truth less often than it claims where the run-to-run spread
  dominates (tests/test_stats.py measures both on the same simulated runs: the two-level bootstrap of runs and
  their steps covered 71% at 2 runs and 83% at 3, the t interval 95%). The t interval is the exact small-sample
  answer when the runs' log values are normal, and its width grows honestly as runs get fewer (2 runs alone: 12.7
  standard errors).
- Pooled: the run-to-run spread is mostly the machine's (a shared 2-core host), not the configuration's, so the
  configurations of one framework in one job share one estimate of it (one-way ANOVA's pooled variance: every
  configuration's repeats add degrees of freedom, and a configuration with a single run still gets an interval).
  Where Levene's test (scipy.stats.levene) says the configurations' spreads differ (p < 0.05), each keeps its own
  spread, and a comparison uses Welch's degrees of freedom.

A comparison of two configurations is the ratio of their estimates (candidate / reference, of a time: below 1 is
faster) with its interval, and ends in exactly one verdict: "faster by X% [lo, hi]", "slower by X% [lo, hi]" or
"no detectable difference". A change is called real only when its whole interval lies beyond the noise floor, how
far two identical configurations (the A/A control) landed apart in the same job (criterion.rs's rule against its
noise threshold); so an A/A pair is called different less often than the interval's 5%.

Within one process (the overhead benchmark, inference latency) the unit is the call: percentile bootstrap
intervals (scipy.stats.bootstrap, seeded) of medians and their ratios, said to be within one process.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

NAN = float("nan")
LEVEL = 0.95
FASTER, SLOWER, NO_DIFFERENCE = "faster", "slower", "no detectable difference"
VERDICTS = (FASTER, SLOWER, NO_DIFFERENCE)
HETEROGENEITY_P = 0.05  # Levene's p below which the configurations keep their own spreads
BOOTSTRAP_RESAMPLES = 2000
SEED = 0  # every bootstrap is seeded: the same rows give the same report


@dataclass(frozen=True)
class Spread:
    """The run-to-run spread a cell's interval uses: the variance of one run's log value, its degrees of freedom,
    and the pool it came from (None: the cell's own runs)."""

    variance: float
    df: float
    pool: str | None = None


@dataclass(frozen=True)
class Estimate:
    """A configuration's typical value: the geometric mean of its runs' values, with the spread its interval uses
    (None: not known, a single run and nothing to pool with)."""

    log_mean: float
    runs: int
    spread: Spread | None = None

    @property
    def value(self) -> float:
        return math.exp(self.log_mean) if math.isfinite(self.log_mean) else NAN

    @property
    def variance(self) -> float:
        """The variance of ``log_mean``."""
        return self.spread.variance / self.runs if self.spread is not None and self.runs else NAN

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        if self.spread is None or not math.isfinite(self.log_mean):
            return NAN, NAN
        half = _t(level, self.spread.df) * math.sqrt(self.variance)
        return math.exp(self.log_mean - half), math.exp(self.log_mean + half)

    def half_width(self, level: float = LEVEL) -> float:
        """The interval's relative half-width (0.05: the value is known within about 5%); NaN when unknown."""
        if self.spread is None:
            return NAN
        return math.exp(_t(level, self.spread.df) * math.sqrt(self.variance)) - 1


def estimates(groups: Mapping[Hashable, Sequence[float]], pool: str) -> dict[Hashable, Estimate]:
    """Each group's estimate from its runs' values (positive; a non-finite value is left out), the spread pooled
    over the groups unless Levene's test says their spreads differ. ``pool`` names the pool (a framework in a
    job), so that two estimates of one pool are compared with the pool's degrees of freedom."""
    logs = {key: np.log([v for v in values if math.isfinite(v) and v > 0]) for key, values in groups.items()}
    repeated = [values for values in logs.values() if len(values) >= 2]
    df = sum(len(values) - 1 for values in repeated)
    pooled = None
    if df > 0 and _homogeneous(repeated):
        pooled = Spread(sum(float(((v - v.mean()) ** 2).sum()) for v in repeated) / df, df, pool)
    out = {}
    for key, values in logs.items():
        own = Spread(float(np.var(values, ddof=1)), len(values) - 1) if len(values) >= 2 else None
        mean = float(values.mean()) if len(values) else NAN
        out[key] = Estimate(mean, len(values), pooled if pooled is not None else own)
    return out


def _homogeneous(samples: list[np.ndarray]) -> bool:
    """Whether the groups' spreads may be pooled: no evidence against it. Levene's test (median-centred, the
    Brown-Forsythe variant, robust to skew) over the groups of 3 runs or more; where fewer than two groups have 3
    (Levene's deviations of a 2-run group are equal by construction, its statistic infinite), Bartlett's test over
    the groups of 2 or more. Fewer than two groups, or none with any spread, give no evidence."""
    if len(samples) < 2 or not any(np.ptp(s) > 0 for s in samples):
        return True
    from scipy import stats

    three = [s for s in samples if len(s) >= 3]
    if len(three) >= 2:
        p = stats.levene(*three, center="median").pvalue
    elif all(np.ptp(s) > 0 for s in samples):
        p = stats.bartlett(*samples).pvalue
    else:  # a group of identical values next to varying ones: Bartlett's log of a zero variance
        return False
    return not (math.isfinite(p) and p < HETEROGENEITY_P)


@dataclass(frozen=True)
class Comparison:
    """``candidate`` against ``reference``: the ratio of two times (below 1: the candidate is faster) with its
    interval, the noise floor it was judged against (a ratio's distance from 1, on the log scale) and the verdict.
    ``why`` says why a comparison is undecided."""

    ratio: float
    lo: float
    hi: float
    verdict: str
    floor: float = 0.0
    why: str = ""

    @property
    def decided(self) -> bool:
        return self.verdict != NO_DIFFERENCE

    @property
    def speedup(self) -> float:
        """How many times faster the candidate is (the reference's time / the candidate's)."""
        return 1 / self.ratio if self.ratio else NAN

    @property
    def speedup_interval(self) -> tuple[float, float]:
        return (1 / self.hi if self.hi else NAN), (1 / self.lo if self.lo else NAN)

    def half_width(self) -> float:
        """The interval's relative half-width on the log scale (0.05: within about 5%); NaN when unknown."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) or self.lo <= 0:
            return NAN
        return math.exp((math.log(self.hi) - math.log(self.lo)) / 2) - 1

    def text(self) -> str:
        """The verdict in the words a reader and a script can find: "faster by X% [lo, hi]", "slower by X% [lo,
        hi]" (the change of the time, in %) or "no detectable difference" with the interval of the change."""
        if self.verdict == FASTER:
            return f"faster by {_pct(1 - self.ratio)}% [{_pct(1 - self.hi)}, {_pct(1 - self.lo)}]"
        if self.verdict == SLOWER:
            return f"slower by {_pct(self.ratio - 1)}% [{_pct(self.lo - 1)}, {_pct(self.hi - 1)}]"
        if not math.isfinite(self.lo):
            return f"{NO_DIFFERENCE} ({self.why})" if self.why else NO_DIFFERENCE
        change = f"[{_pct(self.lo - 1, sign=True)}%, {_pct(self.hi - 1, sign=True)}%]"
        return f"{NO_DIFFERENCE} {change}" + (f" ({self.why})" if self.why else "")

    def speedup_text(self) -> str:
        """"1.52x [1.40, 1.66]": the speedup with its interval."""
        lo, hi = self.speedup_interval
        if not math.isfinite(self.ratio):
            return "-"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return f"{self.speedup:.2f}x"
        return f"{self.speedup:.2f}x [{lo:.2f}, {hi:.2f}]"


def _pct(fraction: float, sign: bool = False) -> str:
    return f"{100 * fraction:+.1f}" if sign else f"{100 * fraction:.1f}"


def _t(level: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf((1 + level) / 2, df)) if math.isfinite(df) else float(stats.norm.ppf((1 + level) / 2))


def judge(ratio: float, lo: float, hi: float, floor: float = 0.0, why: str = "") -> Comparison:
    """The verdict on a ratio of times with its interval: faster or slower only when the whole interval lies beyond
    the noise floor (``floor``: the |log ratio| two identical configurations showed), as criterion.rs judges a change
    against its noise threshold; otherwise no detectable difference, saying why."""
    if not (math.isfinite(ratio) and math.isfinite(lo) and math.isfinite(hi)):
        return Comparison(ratio, lo, hi, NO_DIFFERENCE, floor, why or "too few runs for an interval")
    band = math.exp(floor)
    if hi < 1 / band:
        return Comparison(ratio, lo, hi, FASTER, floor)
    if lo > band:
        return Comparison(ratio, lo, hi, SLOWER, floor)
    if hi < 1 or lo > 1:  # real by its interval, but not beyond what identical configurations showed
        return Comparison(ratio, lo, hi, NO_DIFFERENCE, floor,
                          f"the interval reaches into the noise floor of {_pct(band - 1)}%")
    return Comparison(ratio, lo, hi, NO_DIFFERENCE, floor, why)


def compare(reference: Estimate, candidate: Estimate, floor: float = 0.0, level: float = LEVEL) -> Comparison:
    """``candidate`` against ``reference``: the ratio of their estimates, its t interval and the verdict. Two
    estimates of one pool use the pool's degrees of freedom (the pooled two-sample t); otherwise Welch's
    (Satterthwaite's) combination of their own."""
    ratio = math.exp(candidate.log_mean - reference.log_mean) if reference.runs and candidate.runs else NAN
    if reference.spread is None or candidate.spread is None or not math.isfinite(ratio):
        return judge(ratio, NAN, NAN, floor, _missing(reference, candidate))
    variance = reference.variance + candidate.variance
    same_pool = reference.spread.pool is not None and reference.spread.pool == candidate.spread.pool
    df = reference.spread.df if same_pool else _satterthwaite(reference, candidate)
    half = _t(level, df) * math.sqrt(variance)
    log_ratio = candidate.log_mean - reference.log_mean
    return judge(ratio, math.exp(log_ratio - half), math.exp(log_ratio + half), floor)


def _missing(reference: Estimate, candidate: Estimate) -> str:
    runs = min(reference.runs, candidate.runs)
    if runs == 0:
        return "no finished run"
    return f"{runs} run{'s' if runs != 1 else ''} and no spread to pool: too few runs for an interval"


def _satterthwaite(a: Estimate, b: Estimate) -> float:
    assert a.spread is not None and b.spread is not None
    denominator = sum(e.variance**2 / e.spread.df if e.spread.df else math.inf for e in (a, b))  # type: ignore[union-attr]
    if denominator == 0:  # both spreads zero: nothing varies, the interval is a point
        return math.inf
    return (a.variance + b.variance) ** 2 / denominator


def floor_of(reference: Estimate, duplicate: Estimate) -> float:
    """The noise floor an A/A control measured: |log ratio| of two estimates of one configuration (0 when either
    has no run: not measured)."""
    if not (reference.runs and duplicate.runs):
        return 0.0
    return abs(duplicate.log_mean - reference.log_mean)


def floor_percent(floor: float) -> float:
    return 100 * (math.exp(floor) - 1)


# --- within one process: calls, not runs, are the samples ------------------------------------------------------------


def median_interval(samples: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(median, lo, hi) of one process's samples: the distribution-free order-statistic interval of the median
    (scipy.stats.quantile_test); NaN bounds where there are too few samples for one."""
    return quantile_interval(samples, 0.5, level)


def quantile_interval(samples: Sequence[float], q: float, level: float = LEVEL) -> tuple[float, float, float]:
    """(the ``q`` quantile, lo, hi): exact order-statistic bounds (scipy.stats.quantile_test), NaN where the
    samples are too few to bound it (a p99 from 100 calls has no upper bound)."""
    from scipy import stats

    values = np.asarray([s for s in samples if math.isfinite(s)], dtype=float)
    if len(values) == 0:
        return NAN, NAN, NAN
    point = float(np.quantile(values, q))
    if len(values) < 2:
        return point, NAN, NAN
    ci = stats.quantile_test(values, q=point, p=q).confidence_interval(level)
    lo, hi = float(ci.low), float(ci.high)
    return point, (lo if math.isfinite(lo) else NAN), (hi if math.isfinite(hi) else NAN)


def bootstrap_ratio(reference: Sequence[float], candidate: Sequence[float], paired: bool = False,
                    level: float = LEVEL, seed: int = SEED) -> tuple[float, float, float]:
    """(median(candidate) / median(reference), lo, hi): a seeded percentile bootstrap of the ratio of medians of
    two sets of samples from one process (``paired``: the i-th of each came from the same input)."""
    from scipy import stats

    ref, cand = np.asarray(reference, dtype=float), np.asarray(candidate, dtype=float)
    ratio = float(np.median(cand) / np.median(ref)) if len(ref) and len(cand) else NAN
    if min(len(ref), len(cand)) < 2 or not math.isfinite(ratio):
        return ratio, NAN, NAN
    if paired and len(ref) != len(cand):
        raise ValueError(f"paired samples must be as many: {len(ref)} and {len(cand)}")

    def statistic(r: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(c, axis=axis) / np.median(r, axis=axis)

    result = stats.bootstrap((ref, cand), statistic, paired=paired, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES,
                             confidence_level=level, method="percentile", rng=np.random.default_rng(seed))
    return ratio, float(result.confidence_interval.low), float(result.confidence_interval.high)
