"""PNG plots of a results folder (matplotlib, Agg; imported on first use, so commands start without it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments.execution.frameworks import FRAMEWORKS
from experiments.reporting.cells import NAN, Cells, ordered_groups

MARKERS = {"torch": "o", "jax": "s"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path


def _finished(cells: Cells) -> bool:
    """Whether any cell has a finished run with a step time to draw (a folder of failed runs has none)."""
    return any(math.isfinite(c.step_s) and c.step_s > 0 for c in cells.values())


def plot_step_time(cells: Cells, analysis: Any, path: Path, title: str) -> Path | None:
    """Bars of each configuration's step time (the geometric mean of its runs) with its 95% interval as error bars,
    per group and framework (None, and no file, if no run finished). A bar without an interval (one run, nothing to
    pool) has no whisker."""
    if not _finished(cells):
        return None
    plt = _pyplot()
    names = ordered_groups(cells)
    figure, axis = plt.subplots(figsize=(max(8, 0.9 * len(names) + 2), 4))
    width = 0.38
    for offset, framework in zip((-width / 2, width / 2), FRAMEWORKS, strict=True):
        points = [analysis.estimates.get((n, framework)) for n in names]
        values = [e.value * 1e3 if e is not None and e.runs else NAN for e in points]
        bounds = [e.interval() if e is not None and e.runs else (NAN, NAN) for e in points]
        below = [v - lo * 1e3 if math.isfinite(lo) else 0.0 for v, (lo, _) in zip(values, bounds, strict=True)]
        above = [hi * 1e3 - v if math.isfinite(hi) else 0.0 for v, (_, hi) in zip(values, bounds, strict=True)]
        axis.bar([i + offset for i in range(len(names))], values, width, label=framework, yerr=[below, above],
                 capsize=3, error_kw={"elinewidth": 1})
    axis.set_xticks(range(len(names)), names, rotation=20 if len(names) > 6 else 0, fontsize=8)
    axis.set_ylabel("step time, ms (log), 95% interval")
    axis.set_yscale("log")  # op-by-op JAX is ~30x slower than the rest: linear hides every other bar
    axis.set_title(title)
    axis.legend()
    return _save(figure, path)


def plot_data_wait(cells: Cells, path: Path) -> Path | None:
    if not _finished(cells):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 4))
    labels, waits, computes = [], [], []
    for n in ordered_groups(cells):
        for framework in FRAMEWORKS:
            cell = cells.get((n, framework))
            if cell and cell.runs:
                step = cell.step_s * 1e3
                labels.append(f"{n}\n{framework}")
                waits.append(step * cell.data_wait)
                computes.append(step * (1 - cell.data_wait))
    axis.bar(labels, computes, label="compute")
    axis.bar(labels, waits, bottom=computes, label="data wait")
    axis.set_ylabel("ms per step")
    axis.set_title("data wait vs compute")
    axis.legend()
    axis.tick_params(axis="x", labelsize=7)
    return _save(figure, path)


def plot_memory_vs_time(cells: Cells, path: Path, title: str) -> Path | None:
    """Each value of the sweep as a point: step time against memory (device peak where measured, else the
    bytes saved for backward), one line per framework."""
    if not _finished(cells):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    use_peak = any(c.peak_bytes == c.peak_bytes for c in cells.values() if c.runs)
    for framework in FRAMEWORKS:
        points = [(g, cells[(g, framework)]) for g in ordered_groups(cells)
                  if (g, framework) in cells and cells[(g, framework)].runs]
        xs = [c.step_s * 1e3 for _, c in points]
        ys = [(c.peak_bytes if use_peak else c.saved_bytes) / 1e6 for _, c in points]
        axis.plot(xs, ys, marker=MARKERS.get(framework, "o"), label=framework)
        for (group, _), x, y in zip(points, xs, ys, strict=True):
            axis.annotate(group, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    axis.set_xlabel("median step time, ms")
    axis.set_ylabel(("peak device memory" if use_peak else "activations saved for backward") + ", MB")
    axis.set_title(title)
    axis.legend()
    return _save(figure, path)


def plot_latency(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Batch-1 latency per variant: p50 bars with their 95% intervals (order statistics of the calls) as error bars,
    and the p99 as a mark."""
    from experiments.reporting.stats import quantile_interval

    ok = [r for r in rows if r.get("command") == "infer" and r.get("status") == "ok"]
    if not ok:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 4))
    labels = [f"{r['variant']}\n{r['framework']}" for r in ok]
    p50 = [r["latency_b1_ms"]["p50"] for r in ok]
    p99 = [r["latency_b1_ms"]["p99"] for r in ok]
    bounds = [quantile_interval(r["latency_b1_ms"].get("samples") or [], 0.5)[1:] for r in ok]
    below = [v - lo if math.isfinite(lo) else 0.0 for v, (lo, _) in zip(p50, bounds, strict=True)]
    above = [hi - v if math.isfinite(hi) else 0.0 for v, (_, hi) in zip(p50, bounds, strict=True)]
    axis.bar(labels, p50, label="p50 (95% interval)", yerr=[below, above], capsize=3)
    axis.scatter(labels, p99, color="black", marker="_", s=300, label="p99", zorder=3)
    axis.set_yscale("log")
    axis.set_ylabel("batch-1 latency, ms (log)")
    axis.set_title("inference latency per variant")
    axis.legend()
    axis.tick_params(axis="x", labelsize=7)
    return _save(figure, path)
