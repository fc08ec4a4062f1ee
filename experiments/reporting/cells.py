"""Runs grouped into cells, (group, framework) -> the runs of one configuration over repeats. The group is the rung
of a ladder or the value of a sweep; the A/A control's duplicate runs are a group of their own (the original's name
with AA_SUFFIX). Each run is one value of its cell (its median step time): reporting/analysis.py makes the estimates,
intervals and verdicts from them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from experiments.catalog.rows import AA_SUFFIX, group_of
from experiments.execution.record import RunRecord

NAN = float("nan")
Cells = dict[tuple[str, str], "Cell"]


def median(values: Iterable[float | None]) -> float:
    """The median of the finite values (NaN if there are none: a quantity not measured)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else NAN


@dataclass(frozen=True)
class Cell:
    order: int  # the group's place: rung index or sweep value index
    runs: list[RunRecord] = field(default_factory=list)  # the finished (ok) runs
    failed: int = 0  # runs that did not finish ok, the skipped ones included
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def steps_s(self) -> list[float]:
        """Each finished run's median step time: the cell's values (runs are the unit of replication)."""
        return [r.result.timing.step_s.median for r in self.runs if r.result.timing.step_s is not None]

    @property
    def step_s(self) -> float:
        """The geometric mean of the runs' median step times (the estimate reporting/analysis.py gives an interval)."""
        steps = [s for s in self.steps_s if s > 0]
        return math.exp(statistics.fmean(math.log(s) for s in steps)) if steps else NAN

    @property
    def step_spread(self) -> tuple[float, float]:
        steps = self.steps_s
        return (min(steps), max(steps)) if steps else (NAN, NAN)

    @property
    def control(self) -> bool:
        """Whether this is the A/A control's duplicate of another cell."""
        return any(r.fields.get("control") for r in self.runs)

    @property
    def images_per_s(self) -> float:
        return median(r.result.timing.images_per_s for r in self.runs)

    @property
    def data_wait(self) -> float:
        return median(r.result.timing.data_wait_fraction for r in self.runs)

    @property
    def first_step_s(self) -> float:
        return median(r.result.timing.first_step_s for r in self.runs)

    @property
    def first_step_text(self) -> str:
        """The first step's seconds: "cold / warm" where repeats after the first read repeat 0's compile cache."""
        cold = [r.result.timing.first_step_s for r in self.runs if r.fields.get("cache") == "cold"]
        warm = [r.result.timing.first_step_s for r in self.runs if str(r.fields.get("cache", "")).startswith("warm")]
        if not cold and not warm:
            return "-" if math.isnan(self.first_step_s) else f"{self.first_step_s:.2f}"
        return " / ".join("-" if math.isnan(median(v)) else f"{median(v):.2f}" for v in (cold, warm))

    @property
    def accuracy(self) -> float:
        """Median final accuracy; synthetic data has none worth showing."""
        return median(r.result.eval.accuracy for r in self.runs if r.result.eval and not r.result.synthetic_data)

    @property
    def saved_bytes(self) -> float:
        return median(r.result.memory.get("saved_for_backward_bytes") for r in self.runs)

    @property
    def peak_bytes(self) -> float:
        return median(r.result.memory.get("peak_allocated_bytes") for r in self.runs)

    @property
    def recompiles(self) -> int:
        return max((r.result.recompiles for r in self.runs), default=0)

    @property
    def notes(self) -> list[str]:
        return sorted({n for r in self.runs for n in r.result.notes})

    @property
    def example(self) -> RunRecord | None:
        """The cell's first finished run (its config stands for the cell's)."""
        return self.runs[0] if self.runs else None


def aggregate(records: list[RunRecord], command: str, group_field: str, order_field: str) -> Cells:
    """(group, framework) -> Cell of the ``command``'s runs, grouped by the plan's ``group_field``."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        if record.command != command:
            continue
        key = (group_of(record.fields, group_field), record.framework)
        cell = grouped.setdefault(key, {"order": record.fields[order_field], "runs": [], "failed": 0, "skipped": 0,
                                        "errors": []})
        if record.status == "ok":
            cell["runs"].append(record)
        else:
            cell["failed"] += 1
            cell["skipped"] += record.status == "skipped"
            cell["errors"].append(str(record.result.error or record.status)[:120])
    return {key: Cell(**values) for key, values in grouped.items()}


def ladder_cells(records: list[RunRecord]) -> Cells:
    return aggregate(records, "ladder", "rung", "rung_index")


def sweep_cells(records: list[RunRecord]) -> Cells:
    return aggregate(records, "sweep", "value", "value_index")


def ordered_groups(cells: Cells) -> list[str]:
    """The groups in plan order, the A/A control's duplicate right after its original."""
    return sorted({g for g, _ in cells}, key=lambda g: (min(c.order for (h, _), c in cells.items() if h == g),
                                                         g.endswith(AA_SUFFIX)))


def measured(cells: Cells) -> Cells:
    """The cells of the configurations themselves, the A/A control's duplicates left out (tables and plots show
    those in the noise-floor line, not as a configuration)."""
    return {key: cell for key, cell in cells.items() if not key[0].endswith(AA_SUFFIX)}
