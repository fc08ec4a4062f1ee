"""report.md and its PNG plots for a results folder holding a ladder, a sweep or inference rows, with the
published figures beside ours. Reads the folder's rows only: the device's matmul rate is the row the ladder
and the sweeps stored ("device/matmul-rate"); without it MFU is "not measured"."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.catalog import reference
from experiments.catalog.rows import ADAPTIVE_KEY, MATMUL_RATE_KEY
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.host import Capabilities
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultsError, ResultStore, atomic_write_text, changed_settings, row_settings
from experiments.reporting.accuracy import CHANCE_SPREADS, FLOOR, SPREADS, time_to_target, verdict
from experiments.reporting.analysis import (
    VS_BASELINE,
    VS_REFERENCE,
    Analysis,
    analyse,
    ladder_pairs,
    recommend,
    references,
    sweep_pairs,
)
from experiments.reporting.cells import NAN, Cells, ladder_cells, measured, median, ordered_groups, sweep_cells
from experiments.reporting.curves import plot_curves
from experiments.reporting.plots import plot_data_wait, plot_latency, plot_memory_vs_time, plot_step_time
from experiments.reporting.recommend import Answer, emulation_cost
from experiments.reporting.tables import (
    STEP_MODE_ACCURACY,
    ablation_table,
    across_table,
    augmentation_text,
    fmt,
    inference_table,
    ladder_table,
    mapping_table,
    results_table,
    scaling_table,
    shapes_table,
    trained_epochs,
)

MODES = {"native": "torch eager, JAX jit (each framework's usual mode)", "eager": "both eager (JAX op by op)",
         "compiled": "torch.compile and jax.jit"}
MEMORY_SWEEPS = ("checkpointing", "accumulation", "batch-size", "precision", "attention")
CACHE_TEXT = ("Compile caches: each cumulative rung and framework has its own (torch inductor's, JAX's persistent "
              "compilation cache), and an ablation that keeps the top rung's program reads the top rung's; each is "
              "emptied before its first run in repeat 0, a cold compile, and later runs read it, as a user's second "
              "run would: the 'first step s' column shows both, cold / warm.")


@dataclass(frozen=True)
class Report:
    path: Path  # report.md
    table: str  # its main table (markdown), for the console
    summary: list[str] = field(default_factory=list)  # lines for the console after the tables (recommendations)
    tables: list[str] = field(default_factory=list)  # further tables the console shows (the ablations)


def matmul_rate(rows: list[dict[str, Any]]) -> float | None:
    """The device's fp32 matmul rate (FLOP/s) from the folder's measurement row; None if it has none."""
    for row in rows:
        if row.get("key") == MATMUL_RATE_KEY and row.get("status") == "ok":
            return float(row["flops_per_s"])
    return None


def adaptive_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the folder's adaptive step did (its precision, budget, added repeats and why it stopped), if it ran."""
    return next((row for row in rows if row.get("key") == ADAPTIVE_KEY), None)


def host_lines(host: dict[str, Any]) -> str:
    """The machine and versions a row was measured on, as readable lines."""
    versions = ", ".join(f"{name} {version}" for name, version in (host.get("versions") or {}).items())
    gpus = ", ".join(host.get("gpus") or []) or "none"
    return (f"- CPU: {host.get('cpu_model', '?')} ({host.get('cpus', '?')} cores, {host.get('machine', '?')}); "
            f"GPUs: {gpus}\n- Python {host.get('python', '?')}; {versions}")


def _method(records: list[RunRecord], precision_note: str) -> str:
    runs = [r for r in records if r.status == "ok" and r.command in ("ladder", "sweep")]
    if not runs:
        return ""
    example = runs[0]
    timing = example.result.timing
    repeats = max(int(r.fields.get("repeat", 0)) for r in runs) + 1
    seed = example.fields.get("order_seed")
    order = (f"Within each repeat the configurations ran in a random order drawn from seed {seed} (each row records "
             f"its place), so a machine that slows down over the job favours none. " if seed is not None else "")
    return (f"Each cell: the geometric mean of its runs' median step times, each run a separate process timing "
            f"{timing.timed_steps} steps after {timing.warmup_steps} warm-up step(s) (the first, with compilation, is "
            f"the 'first step' column), every step synchronized (torch.cuda.synchronize / jax.block_until_ready); "
            f"up to {repeats} repeat(s). {order}Intervals: 95% Student t intervals on the logarithms of the runs' "
            f"values, runs being the unit of replication (steps within a run are not independent), the run-to-run "
            f"spread pooled over the framework's configurations in this job (unless Levene's test says their spreads "
            f"differ); a ratio's interval combines both cells' (experiments/reporting/stats.py). Verdicts: 'faster by "
            f"X%' / 'slower by X%' (the change in step time, with its interval) only where the interval excludes no "
            f"change and the change is beyond the noise floor below; otherwise 'no detectable difference'. Training "
            f"augmentation (what the data source allows): {augmentation_text([r.result for r in runs])}. Device: "
            f"{example.result.device}. Host:\n\n{host_lines(example.host)}\n\nBoth frameworks start from the same "
            f"transferred weights, read the same batches in the same order, and use the same optimizer formulas; "
            f"{precision_note}")


def _noise_text(analysis: Analysis) -> str:
    lines = analysis.floor_lines()
    if not lines:
        return ("## Noise floor\n\nNo A/A control in these rows (the job ran with --no-control, its rows predate the "
                "control, or its A/A runs did not finish): the verdicts rest on the intervals alone.")
    return ("## Noise floor (A/A control)\n\nOne configuration ran twice in every repeat, at different places in the "
            "order: how far two identical configurations land apart on this machine, in this job. No verdict calls a "
            "smaller change real.\n\n" + "\n".join(f"- {line}" for line in lines))


def _undecided_text(analysis: Analysis, adaptive: dict[str, Any] | None) -> str:
    precision = adaptive.get("precision") if adaptive else None
    open_ = analysis.open(precision)
    head = "## Undecided comparisons"
    if adaptive:
        added = ", ".join(f"{name} +{count}" for name, count in sorted(adaptive.get("added", {}).items())) or "none"
        head += (f"\n\nAdaptive repeats (precision +-{100 * precision:.0f}% asked" if precision else
                 "\n\nAdaptive repeats (") + (f", time budget {adaptive['budget_s']:g} s" if adaptive.get(
                    "budget_s") else "") + f"): added {added}; stopped: {adaptive.get('stopped')}."
        deferred = adaptive.get("deferred") or []
        if deferred:
            head += (f" The budget left {len(deferred)} requested run(s) of the later repeats out (each configuration "
                     f"kept its first repeat's run; rerun the same command to add them): {', '.join(deferred)}.")
    if not open_:
        return head + "\n\nnone: every comparison is decided" + (" or known within the precision" if precision
                                                                   else "")
    lines = [f"- {j.candidate[0]} {j.kind} ({j.reference[0]}), {_frameworks(j)}: {j.why_open(precision)}"
             for j in open_]
    return head + "\n\n" + "\n".join(lines)


def _frameworks(judged: Any) -> str:
    a, b = judged.reference[1], judged.candidate[1]
    return a if a == b else f"{b} vs {a}"


def _mfu_text(rate: float | None) -> str:
    measured_rate = f"{rate / 1e9:.1f} GFLOP/s" if rate else "not measured"
    return (f"MFU: analytic training FLOPs per step (3x forward, experiments/reporting/flops.py) / step time / "
            f"measured fp32 matmul rate of this device ({measured_rate}).")


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
    """The rows grouped by the settings they were measured with (the store's row_settings), in order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in infer:
        groups.setdefault(json.dumps(row_settings(row), sort_keys=True, default=str), []).append(row)
    return list(groups.values())


def _inference_method(infer: list[dict[str, Any]]) -> str:
    example = infer[0]
    options, training = example.get("options", {}), example.get("training", {})
    return (f"Batch-1 latency: {options.get('calls')} timed calls after {options.get('warmup')} warm-up ones (the "
            f"first call, with any compilation, is its own column); throughput: the median of "
            f"{options.get('throughput_calls')} calls per batch size. Every call is a host batch in and host logits "
            f"out, so it is synchronized. Intervals (95%): each framework's variants are measured in one process, so "
            f"its calls are the samples: order-statistic intervals of the p50 and p99 (scipy.stats.quantile_test; a "
            f"p99 from few calls has no upper bound), and a paired bootstrap (the same input at every call, seeded) "
            f"of each variant's p50 against eager's, with a verdict. They say how precisely this process measured; a "
            f"second process may land elsewhere (the ladder's runs are the unit of replication). Accuracy on the eval "
            f"split ({example.get('eval_batches') or 'all'} batches of 128), delta against the same framework's eager "
            f"fp32; '(chance level)': within {CHANCE_SPREADS:g} standard errors of 1/classes, a model that has learnt "
            f"nothing. Weights: {training}. Device: {sorted({str(r.get('device')) for r in infer})}. Host:\n\n"
            f"{host_lines(example.get('host') or {})}")


def _sweep_parts(folder: Path, records: list[RunRecord], rate: float | None,
                 adaptive: dict[str, Any] | None) -> tuple[list[str], str]:
    cells = sweep_cells(records)
    example = next(r for r in records if r.command == "sweep")
    technique, knob = example.fields["technique"], example.fields["knob"]
    refs = references(records)
    analysis = analyse(cells, sweep_pairs(cells, refs))
    reference = ", ".join(f"{value} ({framework})" for framework, value in refs.items()) or "the first value"
    table = results_table(cells, analysis, rate, technique, ((f"vs the reference ({reference})", VS_REFERENCE),))
    mode = MODES.get(example.fields.get("mode", ""), "as the preset")
    groups = ordered_groups(measured(cells))
    parts = [f"# twinrun sweep report: {technique} ({folder.name})",
             f"Varied: {knob}. Everything else as the preset; mode outside a compile sweep: {mode}. Each value is "
             f"compared with the reference value: {reference}.",
             _method(records, "matmul precision is fp32 'highest' on both."), table,
             STEP_MODE_ACCURACY if not trained_epochs(cells) else "", _mfu_text(rate),
             "Saved for backward: torch counts the distinct storages autograd keeps (saved-tensor hooks); JAX counts "
             "the residuals of the linearized step (jax.ad_checkpoint), where one array kept for two uses counts "
             "twice. Compare within a framework, not across."]
    across = across_table(analysis, groups, technique)
    if across:
        parts += ["## JAX against torch at each value", across]
    parts += [_noise_text(analysis), _undecided_text(analysis, adaptive)]
    if technique == "compile-mode":
        parts.append("jax.jit has no modes: JAX runs once, under `default`.")
    if technique == "scaling":
        parts.append(scaling_table(cells, analysis))
    if technique == "shapes":
        shapes, winners = shapes_table(cells)
        parts += ["## Shapes: batching x compilation over one epoch", shapes,
                  "Real tokens/s counts the texts' own tokens ([CLS] and bytes), never padding, over the epoch's "
                  "training seconds (compiles included); the steady step time is the median after the warm-up, so a "
                  "recompile mid-epoch shows in the epoch and compile columns, not there.",
                  "Which strategy wins here:", "\n".join(winners) or "- fewer than two strategies measured"]
    parts.append(_notes_text(cells))
    shown = measured(cells)
    images = [plot_step_time(shown, analysis, folder / "sweep_step_time.png", f"step time per {technique} value"),
              plot_data_wait(shown, folder / "sweep_data_wait.png")]
    if technique in MEMORY_SWEEPS:
        images.append(plot_memory_vs_time(shown, folder / "sweep_memory_vs_time.png", f"{technique}: memory vs time"))
    parts.append(_images(images))
    return parts, table


def _ladder_parts(folder: Path, records: list[RunRecord], rate: float | None,
                  adaptive: dict[str, Any] | None) -> tuple[list[str], str, list[str], list[str]]:
    cells = ladder_cells(records)
    # the ablations' groups, named by every row, a failed or skipped one too (a cell keeps only finished runs)
    ablated = {str(r.fields.get("rung")) for r in records if r.command == "ladder" and r.fields.get("ablation")}
    order = _order(records)
    top = order[-1] if order else "baseline"
    analysis = analyse(cells, ladder_pairs(cells, order))
    rungs = {k: c for k, c in cells.items() if k[0] not in ablated}
    table = ladder_table(rungs, analysis, rate, cells)
    answers = [Answer(rec, cells, analysis.estimates) for fw in FRAMEWORKS
               if (rec := recommend(analysis, cells, fw)) is not None]
    summary = [a.line() for a in answers]
    parts = [f"# twinrun ladder report: {folder.name}", _device_line(records),
             _method(records, "matmul precision is fp32 'highest' on both until the flags rung.") + " " + CACHE_TEXT,
             "## Cumulative rungs (one technique added per rung)", table,
             STEP_MODE_ACCURACY if not trained_epochs(cells) else "", _mfu_text(rate),
             f"Published (min): minutes of training per rung from {reference.SOURCE}; it also quotes "
             f"{reference.STEP_MS_TEXT} and {reference.GPU_UTILISATION_TEXT}. These are reference figures, not our "
             f"measurements."]
    across = across_table(analysis, ["baseline", *order], "rung")
    if across:
        parts += ["## JAX against torch at each rung", across]
    accuracy_parts, accuracy_summary = _accuracy_parts(folder, records, cells)
    if accuracy_summary is not None:
        summary = accuracy_summary
    parts += accuracy_parts
    tables = []
    if ablated:
        ablations = {k: c for k, c in cells.items() if k[0] in ablated or k[0] in ("baseline", top)}
        ablation = ablation_table(ablations, analysis, rate, cells)
        tables.append(ablation)
        parts += ["## Ablations: the top rung minus one technique",
                  f"What each technique buys once the others are on: each row against the top rung ({top}). The top "
                  "minus the last technique added is the rung below the top, measured above.", ablation]
    parts += [_noise_text(analysis), _undecided_text(analysis, adaptive),
              "## Recommendation",
              "Per framework, among the configurations not detectably slower than the fastest (cumulative rungs and "
              "ablations alike), the one with the fewest techniques; it is recommended only if it is detectably "
              "faster than the baseline.",
              "\n".join(f"- {line}" for line in summary) or "none: no baseline and no other run finished",
              "## What each rung means in each framework\n\n" + mapping_table(order), _emulation_text(cells, analysis),
              _notes_text(cells)]
    parts.append(_images([plot_step_time(measured(cells), analysis, folder / "ladder_step_time.png",
                                         "step time per configuration (95% intervals)"),
                          plot_data_wait(measured(rungs), folder / "ladder_data_wait.png")]))
    return parts, table, summary, tables


def _target(records: list[RunRecord]) -> float | None:
    targets = {r.config.get("target_accuracy") for r in records}
    return next((float(t) for t in targets if t is not None), None)


def _accuracy_parts(folder: Path, records: list[RunRecord], cells: Cells) -> tuple[list[str], list[str] | None]:
    """For a ladder trained in whole epochs: time to the target per rung (end to end, with its interval and its
    verdict against the baseline; training alone), the final accuracy over repeats with its verdict against the
    baseline's spread, the learning curves, and the recommendation by time to accuracy among the rungs that kept
    it (None: not such a ladder)."""
    if not any(r.config.get("steps") is None for r in records):
        return [], None
    target = _target(records)
    shown = measured(cells)

    def reached_s(record: RunRecord) -> float | None:
        hit = time_to_target(record.result, target) if target is not None else None
        return hit[0] if hit is not None else None

    pairs = [(VS_BASELINE, ("baseline", fw), (g, fw)) for g, fw in shown if g != "baseline"]
    analysis = analyse(cells, pairs, value=reached_s) if target is not None else None
    lines = ["| rung | framework | repeats | reached target | time to target s, end to end [95% CI] | "
             "vs baseline | training s to target (median) | final accuracy (mean +- std) | accuracy vs baseline |",
             "|---" * 9 + "|"]
    lost: set[str] = set()
    for group in ordered_groups(shown):
        for framework in FRAMEWORKS:
            cell, base = shown.get((group, framework)), shown.get(("baseline", framework))
            if cell is None:
                continue
            finals = [r.result.eval.accuracy if r.result.eval else NAN for r in cell.runs]
            judged = verdict([r.result.eval.accuracy for r in base.runs if r.result.eval] if base else [], finals)
            hits = [time_to_target(r.result, target) for r in cell.runs] if target is not None else []
            reached = [h for h in hits if h is not None]
            if judged.lost:
                lost.add(f"{group}/{framework}")
            spread = "" if math.isnan(judged.std) else f" +- {judged.std:.3f}"
            tta, against = "-", "-"
            if analysis is not None and reached:
                tta = _seconds_text(analysis.estimates.get((group, framework)))
                found = analysis.find(VS_BASELINE, (group, framework))
                against = found.comparison.text() if found is not None and len(reached) == len(cell.runs) else (
                    "-" if found is None else "not judged: not every run reached the target")
            lines.append(f"| {group} | {framework} | {len(cell.runs)} | "
                         f"{f'{len(reached)}/{len(cell.runs)}' if target is not None else '-'} | {tta} | {against} | "
                         f"{fmt(median(h[1] for h in reached), '{:.1f}')} | "
                         f"{fmt(judged.mean, '{:.3f}')}{spread} | {judged.text} |")
    title = (f"## Time to accuracy (target {target:.3f})" if target is not None else "## Accuracy after whole epochs")
    method = ("Each run trains whole epochs and evaluates on the whole eval split at every epoch end, stopping at "
              "the first evaluation that reaches the target. End to end: from the process's start (interpreter, "
              "imports, data, compilation and evaluations included) to that evaluation, the geometric mean of the runs "
              "that reached it with its 95% t interval (the spread pooled per framework; experiments/reporting/"
              "stats.py); training: its steps alone. Each repeat has its own seed (initial weights and batch order), "
              "the same in both frameworks. Accuracy verdict: 'lost' when the rung's mean final accuracy is below the "
              f"baseline's (same framework) by more than max({SPREADS:g} x the baseline's standard deviation over "
              f"repeats, {FLOOR}).")
    curves = plot_curves(records, folder / "ladder_curves.png")
    parts = [title, method, "\n".join(lines), _images([curves])]
    if analysis is None:
        return parts, None
    answers = []
    for framework in FRAMEWORKS:
        every_run = {g for (g, fw), c in shown.items() if fw == framework and c.runs
                     and all(time_to_target(r.result, target) for r in c.runs)} - {
            g for g in (x.split("/")[0] for x in lost if x.endswith("/" + framework))}
        rec = recommend(analysis, cells, framework, candidates=every_run)
        if rec is not None:
            answers.append(Answer(rec, cells, analysis.estimates, measure="time to accuracy"))
    return parts, [a.line() for a in answers]


def _seconds_text(estimate: Any) -> str:
    if estimate is None or not estimate.runs:
        return "-"
    lo, hi = estimate.interval()
    return f"{estimate.value:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) else " (no interval)")


def _order(records: list[RunRecord]) -> tuple[str, ...]:
    """The ladder's technique order: the techniques of its top cumulative rung."""
    cumulative = [r.fields.get("techniques") or [] for r in records if not r.fields.get("ablation")]
    return tuple(max(cumulative, key=len, default=[]))


def _device_line(records: list[RunRecord]) -> str:
    caps = next((Capabilities.from_dict(r.host.get("capabilities")) for r in records if r.host.get("capabilities")),
                None)
    return "Device capabilities (detected): " + (caps.summary() if caps else "not recorded (rows from before them)")


def _emulation_text(cells: Cells, analysis: Analysis) -> str:
    lines = sorted({f"{group} ({framework}): {emulated.text()}" for (group, framework) in measured(cells)
                    for emulated in [emulation_cost(cells, group, framework, analysis)] if emulated})
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
    tables: list[str] = []
    if any(r.get("command") == "infer" for r in rows):
        parts, table = _inference_parts(target, rows)
    else:
        records = [r for r in store.records() if r.command in ("ladder", "sweep")]
        rate, adaptive = matmul_rate(rows), adaptive_row(rows)
        if any(r.command == "sweep" for r in records):
            parts, table = _sweep_parts(target, records, rate, adaptive)
        else:
            parts, table, summary, tables = _ladder_parts(target, records, rate, adaptive)
    if target != folder:
        parts.insert(1, f"Rows read from {folder}; this report and its plots are written to {target}.")
    path = target / "report.md"
    atomic_write_text(path, "\n\n".join(p for p in parts if p) + "\n")
    return Report(path, table, summary, tables)
