"""report.md and its PNG plots for a results folder holding a ladder, a sweep or inference rows, with the
published figures beside ours. Reads the folder's rows only: the device's matmul rate is the row the ladder
and the sweeps stored ("device/matmul-rate"); without it MFU is "not measured"."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.capabilities import Capabilities
from common.results import RunRecord
from common.store import ResultsError, ResultStore, atomic_write_text, changed_settings, row_settings
from experiments.catalog import reference
from experiments.catalog.rows import MATMUL_RATE_KEY
from experiments.execution.frameworks import FRAMEWORKS
from experiments.reporting.accuracy import CHANCE_SPREADS, FLOOR, SPREADS, time_to_target, verdict
from experiments.reporting.cells import NAN, Cells, ladder_cells, median, ordered_groups, sweep_cells
from experiments.reporting.curves import plot_curves
from experiments.reporting.plots import plot_data_wait, plot_latency, plot_memory_vs_time, plot_step_time
from experiments.reporting.recommend import emulation_cost, fastest
from experiments.reporting.tables import (
    ablation_table,
    fmt,
    inference_table,
    ladder_table,
    mapping_table,
    results_table,
    scaling_table,
    shapes_table,
)

MODES = {"native": "torch eager, JAX jit (each framework's usual mode)", "eager": "both eager (JAX op by op)",
         "compiled": "torch.compile and jax.jit"}
MEMORY_SWEEPS = ("checkpointing", "accumulation", "batch-size", "precision", "attention")
CACHE_TEXT = ("Compile caches: each rung and framework has its own (torch inductor's, JAX's persistent compilation "
              "cache), emptied before repeat 0, so repeat 0's first step is a cold compile; later repeats read repeat "
              "0's cache, as a user's second run would: the 'first step s' column shows both, cold / warm.")


@dataclass(frozen=True)
class Report:
    path: Path  # report.md
    table: str  # its main table (markdown), for the console
    summary: list[str] = field(default_factory=list)  # lines for the console after the table (recommendations)


def matmul_rate(rows: list[dict[str, Any]]) -> float | None:
    """The device's fp32 matmul rate (FLOP/s) from the folder's measurement row; None if it has none."""
    for row in rows:
        if row.get("key") == MATMUL_RATE_KEY and row.get("status") == "ok":
            return float(row["flops_per_s"])
    return None


def _method(records: list[RunRecord], precision_note: str) -> str:
    runs = [r for r in records if r.status == "ok" and r.command in ("ladder", "sweep")]
    if not runs:
        return ""
    example = runs[0]
    timing = example.result.timing
    repeats = max(int(r.fields.get("repeat", 0)) for r in runs) + 1
    return (f"Each cell: median over {repeats} repeat(s), each a separate process, "
            f"of the per-run median step time over {timing.timed_steps} timed steps after "
            f"{timing.warmup_steps} warm-up step(s) (the first, with compilation, is the 'first step' column); "
            f"every step synchronized (torch.cuda.synchronize / jax.block_until_ready). Device: "
            f"{example.result.device}; host: {example.host}. Both frameworks start from the same transferred "
            f"weights, read the same batches in the same order, and use the same optimizer formulas; {precision_note}")


def _mfu_text(rate: float | None) -> str:
    measured = f"{rate / 1e9:.1f} GFLOP/s" if rate else "not measured"
    return (f"MFU: analytic training FLOPs per step (3x forward, common/flops.py) / step time / measured fp32 matmul "
            f"rate of this device ({measured}).")


def _notes_text(cells: Cells) -> str:
    notes = sorted({n for c in cells.values() for n in c.notes})
    return "## Notes (techniques accepted with no effect here)\n\n" + ("\n".join(f"- {n}" for n in notes) or "none")


def _inference_parts(folder: Path, rows: list[dict[str, Any]]) -> tuple[list[str], str]:
    """The inference tables: one per set of settings the rows were measured with (another --calls, config, weights
    or host), each under its own header saying what differs, never mixed under one header without a word."""
    groups = _by_settings([r for r in rows if r.get("command") == "infer"])
    parts, tables = [f"# twinrun inference report: {folder.name}"], []
    if len(groups) > 1:
        warning = (f"Warning: this folder holds inference rows measured with {len(groups)} different settings; "
                   f"each set has its own table below, with what differs from the first: compare rows within a "
                   f"table only.")
        parts.append(f"**{warning}**")
        tables.append(warning)
    first = row_settings(groups[0][0])
    for number, group in enumerate(groups, start=1):
        table = inference_table(group)
        plot = plot_latency(group, folder / ("inference_latency.png" if number == 1 else
                                             f"inference_latency-{number}.png"))
        changed = changed_settings(first, row_settings(group[0]))
        if len(groups) > 1:
            differs = "; ".join(changed[:8]) if changed else "the first set"
            parts.append(f"## Settings {number} of {len(groups)} ({', '.join(sorted({r['key'] for r in group}))})"
                         f"\n\nAgainst the first set: {differs}.")
            tables.append(f"settings {number} of {len(groups)}: {differs}")
        parts += [_inference_method(group), table, _images([plot])]
        tables.append(table)
    return parts, "\n\n".join(tables)


def _by_settings(infer: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows grouped by the settings they were measured with (common/store.py's row_settings), in order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in infer:
        groups.setdefault(json.dumps(row_settings(row), sort_keys=True, default=str), []).append(row)
    return list(groups.values())


def _inference_method(infer: list[dict[str, Any]]) -> str:
    example = infer[0]
    options, training = example.get("options", {}), example.get("training", {})
    return (f"Batch-1 latency: {options.get('calls')} timed calls after {options.get('warmup')} warm-up ones (the "
            f"first call, with any compilation, is its own column); throughput: median of "
            f"{options.get('throughput_calls')} calls per batch size. Every call is a host batch in and host logits "
            f"out, so it is synchronized. Accuracy on the eval split ({example.get('eval_batches') or 'all'} batches "
            f"of 128), delta against the same framework's eager fp32; '(chance level)': within "
            f"{CHANCE_SPREADS:g} standard errors of 1/classes, a model that has learnt nothing. Weights: {training}. "
            f"Device: {sorted({str(r.get('device')) for r in infer})}; host: {example.get('host')}.")


def _sweep_parts(folder: Path, records: list[RunRecord], rate: float | None) -> tuple[list[str], str]:
    cells = sweep_cells(records)
    example = next(r for r in records if r.command == "sweep")
    technique, knob = example.fields["technique"], example.fields["knob"]
    table = results_table(cells, rate, technique)
    mode = MODES.get(example.fields.get("mode", ""), "as the preset")
    parts = [f"# twinrun sweep report: {technique} ({folder.name})",
             f"Varied: {knob}. Everything else as the preset; mode outside a compile sweep: {mode}.",
             _method(records, "matmul precision is fp32 'highest' on both."), table, _mfu_text(rate),
             "Saved for backward: torch counts the distinct storages autograd keeps (saved-tensor hooks); JAX counts "
             "the residuals of the linearized step (jax.ad_checkpoint), where one array kept for two uses counts "
             "twice. Compare within a framework, not across."]
    if technique == "compile-mode":
        parts.append("jax.jit has no modes: JAX runs once, under `default`.")
    if technique == "scaling":
        parts.append(scaling_table(cells))
    if technique == "shapes":
        shapes, winners = shapes_table(cells)
        parts += ["## Shapes: batching x compilation over one epoch", shapes,
                  "Real tokens/s counts the texts' own tokens ([CLS] and bytes), never padding, over the epoch's "
                  "training seconds (compiles included); the steady step time is the median after the warm-up, so a "
                  "recompile mid-epoch shows in the epoch and compile columns, not there.",
                  "Which strategy wins here:", "\n".join(winners) or "- fewer than two strategies measured"]
    parts.append(_notes_text(cells))
    images = [plot_step_time(cells, folder / "sweep_step_time.png", f"step time per {technique} value"),
              plot_data_wait(cells, folder / "sweep_data_wait.png")]
    if technique in MEMORY_SWEEPS:
        images.append(plot_memory_vs_time(cells, folder / "sweep_memory_vs_time.png", f"{technique}: memory vs time"))
    parts.append(_images(images))
    return parts, table


def _ladder_parts(folder: Path, records: list[RunRecord], rate: float | None) -> tuple[list[str], str, list[str]]:
    cells = ladder_cells(records)
    # the ablations' groups, named by every row, a failed or skipped one too (a cell keeps only finished runs)
    ablated = {str(r.fields.get("rung")) for r in records if r.command == "ladder" and r.fields.get("ablation")}
    rungs = {k: c for k, c in cells.items() if k[0] not in ablated}
    order = _order(records)
    table = ladder_table(rungs, rate, cells)
    recommended = fastest(cells)
    summary = [c.line() for c in recommended]
    parts = [f"# twinrun ladder report: {folder.name}", _device_line(records),
             _method(records, "matmul precision is fp32 'highest' on both until the flags rung.") + " " + CACHE_TEXT,
             "## Cumulative rungs (one technique added per rung)", table, _mfu_text(rate),
             f"Published (min): minutes of training per rung from {reference.SOURCE}; it also quotes "
             f"{reference.STEP_MS_TEXT} and {reference.GPU_UTILISATION_TEXT}. These are reference figures, not our "
             f"measurements."]
    accuracy_parts, accuracy_summary = _accuracy_parts(folder, records, cells)
    if accuracy_summary is not None:
        summary = accuracy_summary
    parts += accuracy_parts
    ablations = {k: c for k, c in cells.items() if k[0] in ablated or k[0] in ("baseline", order[-1] if order else "")}
    if ablated:
        parts += ["## Ablations: the top rung minus one technique",
                  "What each technique buys once the others are on: compare each row with the top rung "
                  f"({order[-1] if order else '-'}). The top minus the last technique added is the rung below the "
                  "top, measured above.", ablation_table(ablations, rate, cells)]
    parts += ["## Recommendation: the fastest configuration measured",
              "\n".join(f"- {line}" for line in summary) or "none: no baseline and no other run finished",
              "## What each rung means in each framework\n\n" + mapping_table(order), _emulation_text(cells),
              _notes_text(cells)]
    parts.append(_images([plot_step_time(rungs, folder / "ladder_step_time.png", "step time per rung"),
                          plot_data_wait(rungs, folder / "ladder_data_wait.png")]))
    return parts, table, summary


def _target(records: list[RunRecord]) -> float | None:
    targets = {r.config.get("target_accuracy") for r in records}
    return next((float(t) for t in targets if t is not None), None)


def _accuracy_parts(folder: Path, records: list[RunRecord], cells: Cells) -> tuple[list[str], list[str] | None]:
    """For a ladder trained in whole epochs: time to the target per rung (end to end and training alone), the
    final accuracy over repeats with its verdict against the baseline's spread, the learning curves, and the
    recommendation by time to accuracy among the rungs that kept it (None: not such a ladder)."""
    if not any(r.config.get("steps") is None for r in records):
        return [], None
    target = _target(records)
    lines = ["| rung | framework | repeats | reached target | time to target s (end to end, median) | "
             "training s to target | final accuracy (mean +- std) | verdict vs baseline |", "|---" * 8 + "|"]
    times: dict[tuple[str, str], float] = {}
    lost: set[tuple[str, str]] = set()
    for group in ordered_groups(cells):
        for framework in FRAMEWORKS:
            cell, base = cells.get((group, framework)), cells.get(("baseline", framework))
            if cell is None:
                continue
            finals = [r.result.eval.accuracy if r.result.eval else NAN for r in cell.runs]
            judged = verdict([r.result.eval.accuracy for r in base.runs if r.result.eval] if base else [], finals)
            hits = [time_to_target(r.result, target) for r in cell.runs] if target is not None else []
            reached = [h for h in hits if h is not None]
            elapsed = median(h[0] for h in reached) if reached and len(reached) == len(cell.runs) else NAN
            times[(group, framework)] = elapsed
            if judged.lost:
                lost.add((group, framework))
            spread = "" if math.isnan(judged.std) else f" +- {judged.std:.3f}"
            lines.append(f"| {group} | {framework} | {len(cell.runs)} | "
                         f"{f'{len(reached)}/{len(cell.runs)}' if target is not None else '-'} | "
                         f"{fmt(elapsed, '{:.1f}')} | {fmt(median(h[1] for h in reached), '{:.1f}')} | "
                         f"{fmt(judged.mean, '{:.3f}')}{spread} | {judged.text} |")
    title = (f"## Time to accuracy (target {target:.3f})" if target is not None else "## Accuracy after whole epochs")
    method = ("Each run trains whole epochs and evaluates on the whole eval split at every epoch end, stopping at "
              "the first evaluation that reaches the target. End to end: from the process's start (interpreter, "
              "imports, data, compilation and evaluations included) to that evaluation; training: its steps alone. "
              "Each repeat has its own seed (initial weights and batch order), the same in both frameworks. "
              "Verdict: 'lost' when the rung's mean final accuracy is below the baseline's (same framework) by more "
              f"than max({SPREADS:g} x the baseline's standard deviation over repeats, {FLOOR}).")
    curves = plot_curves(records, folder / "ladder_curves.png")
    parts = [title, method, "\n".join(lines), _images([curves])]
    if target is None:
        return parts, None
    score = {k: v for k, v in times.items() if k not in lost}
    choices = fastest(cells, score, measure="time to accuracy")
    return parts, [c.line() for c in choices]


def _order(records: list[RunRecord]) -> tuple[str, ...]:
    """The ladder's technique order: the techniques of its top cumulative rung."""
    cumulative = [r.fields.get("techniques") or [] for r in records if not r.fields.get("ablation")]
    return tuple(max(cumulative, key=len, default=[]))


def _device_line(records: list[RunRecord]) -> str:
    caps = next((Capabilities.from_dict(r.host.get("capabilities")) for r in records if r.host.get("capabilities")),
                None)
    return "Device capabilities (detected): " + (caps.summary() if caps else "not recorded (rows from before them)")


def _emulation_text(cells: Cells) -> str:
    lines = sorted({f"{group} ({framework}): {emulated.text()}" for (group, framework) in cells
                    for emulated in [emulation_cost(cells, group, framework)] if emulated})
    if not lines:
        return "Emulated on this device: nothing (every dtype that ran is native here)."
    return ("Emulated on this device (the article's technique still runs, and costs this here):\n\n"
            + "\n".join(f"- {line}" for line in lines))


def _images(paths: list[Path | None]) -> str:
    """The plots that were drawn, as markdown images; a line saying why there are none."""
    drawn = [p for p in paths if p is not None]
    if not drawn:
        return "No plots: no run in this folder finished (the table gives each run's error)."
    return "\n\n".join(f"![{p.stem}]({p.name})" for p in drawn)


def write_report(folder: Path, out: Path | None = None) -> Report:
    """report.md (+ PNGs) for a results folder holding a ladder, a sweep or inference rows, written into the folder
    or into ``out`` (a folder the user can write, when the results folder is read-only: its rows are read
    read-only all the same)."""
    store = ResultStore(folder)
    rows = store.rows()
    if not rows:
        raise ResultsError(f"no results in {folder} (neither {store.path.name} nor {store.jsonl.name})")
    target = folder if out is None else out
    summary: list[str] = []
    if any(r.get("command") == "infer" for r in rows):
        parts, table = _inference_parts(target, rows)
    else:
        records = [r for r in store.records() if r.command in ("ladder", "sweep")]
        rate = matmul_rate(rows)
        if any(r.command == "sweep" for r in records):
            parts, table = _sweep_parts(target, records, rate)
        else:
            parts, table, summary = _ladder_parts(target, records, rate)
    if target != folder:
        parts.insert(1, f"Rows read from {folder}; this report and its plots are written to {target}.")
    path = target / "report.md"
    atomic_write_text(path, "\n\n".join(p for p in parts if p) + "\n")
    return Report(path, table, summary)
