"""Learning curves of a ladder (or sweep) in one PNG: training loss and evaluation accuracy, each against the
optimizer step and against the wall clock since the run's process started.

Against steps the two frameworks should lie on one another (same weights, same batches); against wall time a
faster technique reaches the same loss sooner, and the first point sits right of zero by what the user waits for
before the first step (imports, data, compilation). One line per (group, framework): one colour per group, torch
solid and JAX dashed. Each line is one run: the lowest finished repeat of that cell (repeat 0 unless it failed),
since a mean over repeats would blur the curve's shape and the cells' tables already give the spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.record import RunRecord
from experiments.reporting.plots import _pyplot, _save

STYLES = {"torch": "-", "jax": "--"}
PANELS = (("step", "training loss"), ("wall", "training loss"), ("step", "eval accuracy"), ("wall", "eval accuracy"))


@dataclass(frozen=True)
class Curve:
    """One run's points, ready to draw."""

    group: str
    framework: str
    repeat: int
    steps: list[int]  # optimizer steps done at each loss (1-based, as an evaluation's step)
    losses: list[float]
    loss_s: list[float]  # seconds from the process's start at each step's end (empty in older rows)
    eval_steps: list[int]
    accuracies: list[float]  # empty where the data are synthetic (their accuracy means nothing)
    eval_s: list[float]


def plot_curves(records: list[RunRecord], path: Path, group_field: str = "rung",
                order_field: str = "rung_index") -> Path | None:
    """The 2x2 figure at ``path`` (loss and accuracy, against step and against wall time) for the finished runs
    among ``records``; None, and no file, when no finished run has losses. Sweeps pass ``value``/``value_index``."""
    curves = _curves(records, group_field, order_field)
    if not curves:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    groups = list(dict.fromkeys(c.group for c in curves))
    colours = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    for axis, (x_kind, quantity) in zip(axes.flat, PANELS, strict=True):
        drawn = sum(_draw(axis, curve, x_kind, quantity, colours[curve.group]) for curve in curves)
        axis.set_xlabel("optimizer step" if x_kind == "step" else "seconds since the process started")
        axis.set_ylabel(quantity)
        if not drawn:
            axis.text(0.5, 0.5, _missing(x_kind, quantity), ha="center", va="center", transform=axis.transAxes,
                      fontsize=9, color="grey")
    _legend(axes.flat[0], groups, colours, curves)
    repeats = sorted({c.repeat for c in curves})
    figure.suptitle(f"learning curves (repeat {', '.join(map(str, repeats))} of each {group_field}; "
                    f"torch solid, JAX dashed)")
    return _save(figure, path)


def _curves(records: list[RunRecord], group_field: str, order_field: str) -> list[Curve]:
    """The lowest finished repeat with losses of each (group, framework), in the groups' order."""
    chosen: dict[tuple[str, str], RunRecord] = {}
    for record in records:
        if (record.status != "ok" or not record.result.losses or group_field not in record.fields
                or record.fields.get("control")):  # the A/A control's duplicate draws its original again
            continue
        key = (str(record.fields[group_field]), record.framework)
        if key not in chosen or _repeat(record) < _repeat(chosen[key]):
            chosen[key] = record
    order = {key: (record.fields.get(order_field, 0), _framework_order(key[1])) for key, record in chosen.items()}
    return [_curve(key[0], chosen[key]) for key in sorted(chosen, key=lambda k: order[k])]


def _curve(group: str, record: RunRecord) -> Curve:
    result = record.result
    steps = [result.start_step + i + 1 for i in range(len(result.losses))]
    shown = [] if result.synthetic_data else result.evals
    return Curve(group=group, framework=record.framework, repeat=_repeat(record), steps=steps,
                 losses=list(result.losses), loss_s=list(result.step_elapsed_s),
                 eval_steps=[e.step for e in shown], accuracies=[e.accuracy for e in shown],
                 eval_s=[e.elapsed_s for e in shown])


def _draw(axis: Any, curve: Curve, x_kind: str, quantity: str, colour: Any) -> bool:
    """One curve on one panel; False when it has nothing for it (no evaluations, no wall times in an old row)."""
    loss = quantity == "training loss"
    ys = curve.losses if loss else curve.accuracies
    xs: list[float] = list(curve.steps if loss else curve.eval_steps) if x_kind == "step" else \
        list(curve.loss_s if loss else curve.eval_s)
    if len(xs) != len(ys):  # an older row: losses without their wall times
        return False
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if not points:
        return False
    axis.plot([x for x, _ in points], [y for _, y in points], linestyle=STYLES.get(curve.framework, ":"),
              color=colour, linewidth=1.3, marker=None if loss else "o", markersize=3)
    return True


def _legend(axis: Any, groups: list[str], colours: dict[str, Any], curves: list[Curve]) -> None:
    """Colours name the groups and line styles the frameworks (proxies: one entry each, not one per line)."""
    from matplotlib.lines import Line2D  # after _pyplot() has chosen the Agg backend

    handles = [Line2D([], [], color=colours[g], linewidth=2, label=g) for g in groups]
    handles += [Line2D([], [], color="black", linestyle=STYLES.get(f, ":"), label=f)
                for f in dict.fromkeys(c.framework for c in curves)]
    axis.legend(handles=handles, fontsize=7)


def _missing(x_kind: str, quantity: str) -> str:
    if quantity == "eval accuracy":
        return "no evaluations to show (or synthetic data)"
    return "no wall times (rows from before they were recorded)" if x_kind == "wall" else "no losses"


def _repeat(record: RunRecord) -> int:
    return int(record.fields.get("repeat", 0))


def _framework_order(framework: str) -> int:
    return FRAMEWORKS.index(framework) if framework in FRAMEWORKS else len(FRAMEWORKS)
