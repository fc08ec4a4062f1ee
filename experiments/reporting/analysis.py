"""What a ladder's or a sweep's cells say (reporting/stats.py does the numbers): each configuration's estimate with
its 95% interval, the noise floor the A/A control measured, every comparison the report prints with its verdict,
which comparisons stayed undecided, and the ladder's recommendation.

The run-to-run spread is pooled per framework and job (a framework's configurations in one results folder share the
machine's noise); the A/A control gives each framework its noise floor; a comparison across frameworks takes the
larger of the two floors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from experiments.catalog.rows import AA_SUFFIX
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.record import RunRecord
from experiments.reporting.cells import Cell, Cells, ordered_groups
from experiments.reporting.stats import (
    FASTER,
    SLOWER,
    Comparison,
    Estimate,
    compare,
    estimates,
    floor_of,
    floor_percent,
)

Configuration = tuple[str, str]  # (group, framework)
RunValue = Callable[[RunRecord], float | None]  # a run's one value (its median step time, its time to accuracy)

VS_BASELINE, VS_BELOW, VS_TOP, VS_REFERENCE, ACROSS = ("vs baseline", "vs the rung below", "vs the top rung",
                                                        "vs the reference", "JAX vs torch")


def step_value(record: RunRecord) -> float | None:
    """A run's median step time over its timed steps."""
    step = record.result.timing.step_s
    return step.median if step is not None else None


@dataclass(frozen=True)
class Judged:
    """One comparison the report prints: what it compares (``kind``), the two configurations, and its verdict."""

    kind: str
    reference: Configuration
    candidate: Configuration
    comparison: Comparison

    def settled(self, precision: float | None) -> bool:
        """Decided (faster or slower), or known within ``precision`` (its half-width at most that): more runs would
        not change what the report can say."""
        if self.comparison.decided:
            return True
        width = self.comparison.half_width()
        return precision is not None and math.isfinite(width) and width <= precision

    def why_open(self, precision: float | None) -> str:
        """Why this comparison is undecided, for the report's list."""
        c = self.comparison
        width = c.half_width()
        if not math.isfinite(width):
            return c.why or "too few runs for an interval"
        goal = f" (precision asked: +-{100 * precision:.0f}%)" if precision is not None else ""
        reason = f"; {c.why}" if c.why else "; the interval includes no change"
        return f"interval +-{100 * width:.1f}%{goal}{reason}"


@dataclass(frozen=True)
class Analysis:
    """A job's estimates (configuration -> Estimate), noise floors and A/A controls (framework -> ...), and the
    comparisons with their verdicts."""

    estimates: dict[Configuration, Estimate]
    floors: dict[str, float] = field(default_factory=dict)  # |log ratio| of the A/A pair, per framework
    controls: dict[str, Configuration] = field(default_factory=dict)  # framework -> the configuration run twice
    judged: list[Judged] = field(default_factory=list)

    def find(self, kind: str, candidate: Configuration) -> Judged | None:
        return next((j for j in self.judged if j.kind == kind and j.candidate == candidate), None)

    def open(self, precision: float | None) -> list[Judged]:
        return [j for j in self.judged if not j.settled(precision)]

    def needs_more(self, precision: float | None) -> set[Configuration]:
        """The configurations of the undecided comparisons: the adaptive step runs them again."""
        return {c for j in self.open(precision) for c in (j.reference, j.candidate)}

    def compare(self, reference: Configuration, candidate: Configuration) -> Comparison:
        floor = max(self.floors.get(reference[1], 0.0), self.floors.get(candidate[1], 0.0))
        return compare(self.estimates[reference], self.estimates[candidate], floor)

    def floor_lines(self) -> list[str]:
        """The noise floor, per framework, in words."""
        lines = []
        for framework in FRAMEWORKS:
            control = self.controls.get(framework)
            if control is None:
                continue
            original, duplicate = self.estimates[control], self.estimates[(control[0] + AA_SUFFIX, framework)]
            pair = compare(original, duplicate)
            lines.append(f"{framework}: {control[0]} run twice per repeat ({original.runs} + {duplicate.runs} runs), "
                         f"the two landed {floor_percent(self.floors[framework]):.1f}% apart (interval of their ratio "
                         f"{_bounds(pair)}): changes smaller than {floor_percent(self.floors[framework]):.1f}% are "
                         f"not called real")
        return lines


def _bounds(c: Comparison) -> str:
    if not (math.isfinite(c.lo) and math.isfinite(c.hi)):
        return "unknown: too few runs"
    return f"[{c.lo:.3f}, {c.hi:.3f}]"


def cell_estimates(cells: Cells, value: RunValue = step_value) -> dict[Configuration, Estimate]:
    """Each cell's estimate from its finished runs' values, the spread pooled per framework."""
    out: dict[Configuration, Estimate] = {}
    for framework in FRAMEWORKS:
        groups = {group: [v for r in cell.runs if (v := value(r)) is not None]
                  for (group, fw), cell in cells.items() if fw == framework}
        out.update({(group, framework): e for group, e in estimates(groups, framework).items()})
    return out


def _controls(cells: Cells, found: dict[Configuration, Estimate]) -> tuple[dict[str, float], dict[str, Configuration]]:
    floors, controls = {}, {}
    for group, framework in cells:
        if not group.endswith(AA_SUFFIX):
            continue
        original = (group[: -len(AA_SUFFIX)], framework)
        if original in found and found[original].runs and found[(group, framework)].runs:
            floors[framework] = floor_of(found[original], found[(group, framework)])
            controls[framework] = original
    return floors, controls


def analyse(cells: Cells, pairs: Iterable[tuple[str, Configuration, Configuration]],
            value: RunValue = step_value) -> Analysis:
    """The estimates of ``cells``, their A/A floors, and each (kind, reference, candidate) of ``pairs`` judged
    (a pair naming a configuration without runs is left out)."""
    found = cell_estimates(cells, value)
    floors, controls = _controls(cells, found)
    analysis = Analysis(found, floors, controls)
    judged = [Judged(kind, ref, cand, analysis.compare(ref, cand)) for kind, ref, cand in pairs
              if ref in found and cand in found and found[ref].runs and found[cand].runs]
    return Analysis(found, floors, controls, judged)


def ladder_pairs(cells: Cells, order: tuple[str, ...]) -> list[tuple[str, Configuration, Configuration]]:
    """The ladder's comparisons: each cumulative rung against the baseline and against the rung below, each
    ablation against the top rung, and JAX against torch at each cumulative rung."""
    rungs = ["baseline", *order]
    ablations = [g for g in ordered_groups(cells) if g.startswith("minus-")]
    pairs = []
    for framework in FRAMEWORKS:
        for below, rung in zip(rungs, rungs[1:], strict=False):
            pairs.append((VS_BASELINE, ("baseline", framework), (rung, framework)))
            if below != "baseline":
                pairs.append((VS_BELOW, (below, framework), (rung, framework)))
        pairs += [(VS_TOP, (rungs[-1], framework), (ablation, framework)) for ablation in ablations]
    pairs += [(ACROSS, (rung, "torch"), (rung, "jax")) for rung in rungs]
    return pairs


def sweep_pairs(cells: Cells, references: dict[str, str]) -> list[tuple[str, Configuration, Configuration]]:
    """A sweep's comparisons: each value against the reference value (per framework), and JAX against torch at
    each value both ran."""
    pairs = []
    groups = [g for g in ordered_groups(cells) if not g.endswith(AA_SUFFIX)]
    for framework, reference in references.items():
        pairs += [(VS_REFERENCE, (reference, framework), (g, framework)) for g in groups
                  if g != reference and (g, framework) in cells]
    pairs += [(ACROSS, (g, "torch"), (g, "jax")) for g in groups if (g, "torch") in cells and (g, "jax") in cells]
    return pairs


def references(records: list[RunRecord]) -> dict[str, str]:
    """A sweep's reference value per framework, as its rows name it."""
    return {r.framework: str(r.fields["reference"]) for r in records if "reference" in r.fields}


@dataclass(frozen=True)
class Recommendation:
    """Per framework: the configuration with the fewest techniques among those not detectably slower than the
    fastest, what it is tied with, and how it compares with the baseline."""

    framework: str
    chosen: str
    fastest: str
    tied: list[str]
    against_baseline: Comparison | None
    supported: bool  # the chosen configuration is detectably faster than the baseline


def recommend(analysis: Analysis, cells: Cells, framework: str, candidates: set[str] | None = None) -> \
        Recommendation | None:
    """Among the framework's configurations (``candidates``, default every measured one but the A/A duplicate),
    those not detectably slower than the fastest; of those, the one with the fewest techniques (the faster on a
    tie). None when the baseline or every configuration lacks a finished run."""
    mine = {g: e for (g, fw), e in analysis.estimates.items() if fw == framework and e.runs
            and not g.endswith(AA_SUFFIX) and (candidates is None or g in candidates)}
    if not mine or "baseline" not in mine:
        return None
    fastest = min(mine, key=lambda g: mine[g].value)
    tied = [g for g in mine
            if g != fastest and analysis.compare((fastest, framework), (g, framework)).verdict != SLOWER]
    chosen = min([fastest, *tied], key=lambda g: (len(_techniques(cells.get((g, framework)))), mine[g].value))
    against = None if chosen == "baseline" else analysis.compare(("baseline", framework), (chosen, framework))
    supported = against is not None and against.verdict == FASTER
    return Recommendation(framework, chosen, fastest, [g for g in [fastest, *tied] if g != chosen], against, supported)


def _techniques(cell: Cell | None) -> list[str]:
    example = cell.example if cell is not None else None
    return list(example.fields.get("techniques") or []) if example is not None else []
