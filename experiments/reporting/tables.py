"""Markdown tables of a results folder: runs per group x framework (step time with its interval, speedup and
verdicts, throughput, data wait, compile, memory, accuracy, MFU), JAX against torch, scaling efficiency, the rung
mapping, and inference variants."""

from __future__ import annotations

import math
from typing import Any

from common.config import RunConfig
from common.errors import TwinrunError
from common.results import RunResult
from common.workloads import arch, num_classes, workload_for
from experiments.catalog import reference
from experiments.catalog.rungs import BASELINE_TEXT, TECHNIQUES
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.record import RunRecord
from experiments.reporting.accuracy import at_chance
from experiments.reporting.analysis import ACROSS, VS_BASELINE, VS_BELOW, VS_TOP, Analysis
from experiments.reporting.cells import NAN, Cells, measured, median, ordered_groups
from experiments.reporting.flops import NoFlopCount, train_step_flops
from experiments.reporting.recommend import emulation_cost
from experiments.reporting.stats import Comparison, Estimate, bootstrap_ratio, judge, quantile_interval

FALLBACK_CLASSES = 100  # rows written before results held their class count, on data no longer readable


def fmt(value: float, pattern: str) -> str:
    return "-" if value != value else pattern.format(value)  # NaN -> "-"


def augmentation_text(results: list[RunResult]) -> str:
    """The training augmentations the runs' data allowed ("crop, flip"; several, where rows differ), or that the rows
    predate their record."""
    recorded = sorted({", ".join(r.augmentations) or "none" for r in results if r.augmentations is not None})
    return " / ".join(recorded) or "not recorded (rows from before it)"


def classes_of(record: RunRecord, config: RunConfig) -> int:
    """The run's class count: from its result, or (rows written before results held it) from its data."""
    if record.result.num_classes:
        return record.result.num_classes
    try:
        return num_classes(config)
    except (TwinrunError, OSError):
        return FALLBACK_CLASSES


def flops_per_step(record: RunRecord) -> float:
    """Analytic training FLOPs of one optimizer step of the run: every micro-batch of every replica. NaN for a text
    model: its steps' padded lengths differ, so one step's FLOPs is no property of the run ("not measured")."""
    config = RunConfig.from_dict(record.config)
    if workload_for(config.model).family == "text":
        return NAN
    model = arch(config, classes_of(record, config))
    try:
        return train_step_flops(model, config.image_size, config.batch_size * config.grad_accum_steps * config.devices)
    except NoFlopCount:
        return NAN


def mfu_percent(record: RunRecord, step_s: float, matmul_rate: float | None) -> float:
    """Model FLOPs utilisation: FLOPs per step / step time / (the device's matmul rate x replicas' devices)."""
    if not matmul_rate:
        return NAN
    devices = int(record.config.get("devices", 1))  # each replica's device has the measured rate
    return 100 * flops_per_step(record) / step_s / (matmul_rate * devices)


def examples_unit(models: set[str]) -> str:
    """What the rows' throughput counts: their family's examples (images, texts), or "examples" for a mix."""
    units = {workload_for(model).examples for model in models}
    return units.pop() if len(units) == 1 else "examples"


def _cached(cells: Cells) -> bool:
    """Whether the runs say which compile cache they read (the ladder's: cold for the first use, warm after)."""
    return any("cache" in r.fields for c in cells.values() for r in c.runs)


def _failed_line(group: str, framework: str, failed: int, skipped: int, errors: list[str], width: int) -> str:
    what = "skipped" if skipped == failed else f"failed ({failed} runs)"
    text = f"{what}: {'; '.join(sorted(set(errors)))[:150]}"
    return f"| {group} | {framework} | {text} |" + " |" * (width - 3)


def step_text(estimate: Estimate | None) -> str:
    """"41.6 [37.5, 45.8]": a cell's step time in ms with its 95% interval."""
    if estimate is None or not estimate.runs:
        return "-"
    lo, hi = estimate.interval()
    bounds = f" [{lo * 1e3:.1f}, {hi * 1e3:.1f}]" if math.isfinite(lo) else " (no interval)"
    return f"{estimate.value * 1e3:.1f}{bounds}"


def trained_epochs(cells: Cells) -> bool:
    """Whether the runs trained whole epochs (an accuracy worth a column); a few timed steps say nothing of it."""
    return any(r.config.get("steps") is None for c in cells.values() for r in c.runs)


STEP_MODE_ACCURACY = ("Accuracy: '-' in step-time mode: each run trains a few timed steps, after which the accuracy "
                      "says nothing (the time-to-accuracy ladder, --to-accuracy or --epochs, measures it).")


def results_table(cells: Cells, analysis: Analysis, matmul_rate: float | None, group_title: str,
                  verdicts: tuple[tuple[str, str], ...] = (), published: dict[str, str] | None = None,
                  precision: Cells | None = None) -> str:
    """Group x framework: step time with its 95% interval and runs, speedup (with its interval) over the first group,
    a verdict column per (title, kind of comparison) of ``verdicts``, throughput, data wait, compile, memory,
    accuracy (whole-epoch runs only), MFU; ``published`` adds the reference column (torch rows); ``precision``
    (every cell of the plan) a column with the dtype that ran, flagged with its cost where this device emulates it.
    The A/A control's duplicates are left out (the noise-floor lines say what they measured)."""
    cells = measured(cells)
    groups = ordered_groups(cells)
    unit = examples_unit({r.config["model"] for c in cells.values() for r in c.runs if "model" in r.config})
    accuracy = trained_epochs(cells)
    columns = [group_title, "framework", *(["precision"] if precision is not None else []),
               "step ms [95% CI]", "runs", f"speedup vs {groups[0] if groups else '-'} [95% CI]",
               *(title for title, _ in verdicts), f"{unit}/s", "data wait %",
               "first step s (cold / warm)" if _cached(cells) else "first step s", "recompiles",
               "saved for backward MB", "peak MB", "accuracy", "MFU %"]
    if published is not None:
        columns.append("published (min)")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for group in groups:
        for framework in FRAMEWORKS:
            cell = cells.get((group, framework))
            if cell is None:
                continue
            if cell.example is None:
                lines.append(_failed_line(group, framework, cell.failed, cell.skipped, cell.errors, len(columns)))
                continue
            estimate = analysis.estimates.get((group, framework))
            first = (groups[0], framework)
            speedup = ("-" if group == groups[0] or first not in analysis.estimates
                       else analysis.compare(first, (group, framework)).speedup_text())
            judged = [analysis.find(kind, (group, framework)) for _, kind in verdicts]
            dtype = [precision_cell(precision, group, framework, analysis)] if precision is not None else []
            values = [group, framework, *dtype, step_text(estimate), str(len(cell.runs)), speedup,
                      *(j.comparison.text() if j is not None else "-" for j in judged),
                      fmt(cell.images_per_s, "{:.0f}"), fmt(100 * cell.data_wait, "{:.1f}"), cell.first_step_text,
                      str(cell.recompiles), fmt(cell.saved_bytes / 1e6, "{:.1f}"), fmt(cell.peak_bytes / 1e6, "{:.1f}"),
                      fmt(cell.accuracy, "{:.3f}") if accuracy else "-",
                      fmt(mfu_percent(cell.example, cell.step_s, matmul_rate), "{:.1f}")]
            if published is not None:
                values.append((published or {}).get(group, "") if framework == "torch" else "")
            lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def across_table(analysis: Analysis, groups: list[str], group_title: str) -> str:
    """JAX against torch at each group both ran: each one's step time and the ratio with its verdict."""
    lines = [f"| {group_title} | torch step ms [95% CI] | JAX step ms [95% CI] | JAX / torch step time [95% CI] | "
             "JAX vs torch |", "|---|---|---|---|---|"]
    for group in groups:
        judged = analysis.find(ACROSS, (group, "jax"))
        if judged is None:
            continue
        c = judged.comparison
        ratio = f"{c.ratio:.2f}" + (f" [{c.lo:.2f}, {c.hi:.2f}]" if math.isfinite(c.lo) else "")
        lines.append(f"| {group} | {step_text(analysis.estimates.get((group, 'torch')))} | "
                     f"{step_text(analysis.estimates.get((group, 'jax')))} | {ratio} | {c.text()} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def scaling_table(cells: Cells, analysis: Analysis) -> str:
    """Throughput per replica count and scaling efficiency, with intervals: images/s at N over images/s at 1 (the
    global batch grows with N, so it is N x the step-time ratio), and that over N."""
    lines = ["| replicas | framework | images/s (global batch) | throughput vs 1 replica [95% CI] | "
             "scaling efficiency % [95% CI] |", "|---|---|---|---|---|"]
    cells = measured(cells)
    for group in ordered_groups(cells):
        for framework in FRAMEWORKS:
            cell = cells.get((group, framework))
            if not cell or not cell.runs or ("1", framework) not in analysis.estimates:
                continue
            n = int(group)
            c = analysis.compare(("1", framework), (group, framework))
            lo, hi = c.speedup_interval
            bounds = math.isfinite(lo) and math.isfinite(hi)
            speedup = f"{n * c.speedup:.2f}x" + (f" [{n * lo:.2f}, {n * hi:.2f}]" if bounds else "")
            efficiency = f"{100 * c.speedup:.0f}" + (f" [{100 * lo:.0f}, {100 * hi:.0f}]" if bounds else "")
            lines.append(f"| {group} | {framework} | {cell.images_per_s:.0f} | {speedup} | {efficiency} |")
    return ("Scaling (each replica keeps the preset's batch; on a CPU the replicas share its cores):\n\n"
            + "\n".join(lines))


def _epoch_s(cell: Any) -> float:
    """Seconds of training steps over the run's one epoch, compiles included (the final evaluation's train_s)."""
    return median(r.result.evals[-1].train_s if r.result.evals else None for r in cell.runs)


def _compile_s(cell: Any) -> float:
    return median(r.result.compile_s for r in cell.runs)


def shapes_table(cells: Cells) -> tuple[str, list[str]]:
    """The shapes sweep per framework x strategy: the epoch's padded lengths, graphs compiled, compile seconds,
    steady-state step time, real (unpadded) tokens a second over the whole epoch, padding waste and the epoch's
    end-to-end seconds; and, per framework, which strategy finished the epoch first and by how much."""
    lines = ["| strategy | framework | padded lengths | graphs compiled | compile s | steady step ms | real tokens/s "
             "(epoch) | padding waste % | epoch s (end to end) |", "|---|---|---|---|---|---|---|---|---|"]
    for group in ordered_groups(cells):
        for framework in FRAMEWORKS:
            cell = cells.get((group, framework))
            if not cell or not cell.runs:
                continue
            fields, epoch_s = cell.example.fields, _epoch_s(cell)  # type: ignore[union-attr]
            graphs = max(r.result.graphs_compiled for r in cell.runs)
            lines.append(f"| {group} | {framework} | {len(fields.get('padded_lengths', []))} | "
                         f"{graphs if cell.example.config.get('compile') == 'compiled' else '-'} | "  # type: ignore[union-attr]
                         f"{fmt(_compile_s(cell), '{:.1f}')} | {fmt(cell.step_s * 1e3, '{:.1f}')} | "
                         f"{fmt(fields.get('real_tokens', NAN) / epoch_s, '{:.0f}')} | "
                         f"{fmt(100 * fields.get('padding_waste', NAN), '{:.1f}')} | {fmt(epoch_s, '{:.1f}')} |")
    return "\n".join(lines), _shape_winners(cells)


def _shape_winners(cells: Cells) -> list[str]:
    """Per framework: the strategy with the shortest epoch, against the slowest and against pad-max."""
    verdicts = []
    for framework in FRAMEWORKS:
        epochs = {g: _epoch_s(c) for (g, f), c in cells.items() if f == framework and c.runs}
        epochs = {g: s for g, s in epochs.items() if s == s}  # measured ones
        if len(epochs) < 2:
            continue
        best, worst = min(epochs, key=epochs.get), max(epochs, key=epochs.get)  # type: ignore[arg-type]
        against = (f"; {epochs['pad-max'] / epochs[best]:.2f}x faster than pad-max"
                   if "pad-max" in epochs and best != "pad-max" else "")
        verdicts.append(f"- {framework}: **{best}** finished the epoch first, {epochs[best]:.1f} s, "
                        f"{epochs[worst] / epochs[best]:.2f}x faster than the slowest ({worst}, "
                        f"{epochs[worst]:.1f} s){against}")
    return verdicts


def precision_cell(cells: Cells, group: str, framework: str, analysis: Analysis | None = None) -> str:
    """The dtype that ran, with "emulated here: +X% vs fp32" where this device emulates it."""
    cell = cells[(group, framework)]
    dtype = str(cell.example.config.get("precision")) if cell.example else "-"
    emulated = emulation_cost(cells, group, framework, analysis)
    return f"{dtype} ({emulated.short()})" if emulated else dtype


def ladder_table(cells: Cells, analysis: Analysis, matmul_rate: float | None, every: Cells) -> str:
    """The cumulative rungs, each against the baseline and the rung below, with the published minutes of the case
    study beside torch's; ``every``: the plan's cells, ablations included (an emulated dtype's cost is measured
    against its fp32 twin)."""
    return results_table(cells, analysis, matmul_rate, "rung", ((VS_BASELINE, VS_BASELINE), (VS_BELOW, VS_BELOW)),
                         published={k: f"{v:g}" for k, v in reference.MINUTES.items()}, precision=every)


def ablation_table(cells: Cells, analysis: Analysis, matmul_rate: float | None, every: Cells) -> str:
    """The baseline, the top rung and "top minus X" for each technique X, each against the top rung: what each
    technique buys with the others on."""
    return results_table(cells, analysis, matmul_rate, "configuration", ((VS_TOP, VS_TOP),), precision=every)


def mapping_table(order: tuple[str, ...]) -> str:
    lines = ["| rung | adds | torch | JAX |", "|---|---|---|---|", "| baseline | " + " | ".join(BASELINE_TEXT) + " |"]
    lines += [f"| {name} | {t.adds} | {t.torch} | {t.jax} |" for name in order for t in [TECHNIQUES[name]]]
    return "\n".join(lines)


def _ms_interval(samples: list[float], q: float, point: float) -> str:
    """"1.23 [1.20, 1.31]": a quantile of one process's calls (ms) with its order-statistic interval."""
    if not samples:
        return f"{point:.2f}"
    value, lo, hi = quantile_interval(samples, q)
    return f"{value:.2f} [{fmt(lo, '{:.2f}')}, {fmt(hi, '{:.2f}')}]"


def _throughput_cell(measured_row: dict[str, Any]) -> str:
    """Examples a second at one batch size: batch / the median call, with the median's interval."""
    if not measured_row:
        return "-"
    samples = measured_row.get("samples_ms") or []
    rate = measured_row.get("images_per_s", NAN)
    if not samples:
        return fmt(rate, "{:.0f}")
    median_ms, lo, hi = quantile_interval(samples, 0.5)
    batch = rate * median_ms / 1e3
    bounds = f" [{fmt(batch / hi * 1e3, '{:.0f}')}, {fmt(batch / lo * 1e3, '{:.0f}')}]" if hi == hi and lo == lo else ""
    return f"{rate:.0f}{bounds}"


def against_eager(row: dict[str, Any], eager: dict[str, Any] | None) -> Comparison | None:
    """A variant's batch-1 latency against its framework's eager one: the ratio of their medians over the same
    inputs, call by call (a paired bootstrap within the one process that measured both)."""
    if eager is None or row is eager:
        return None
    a, b = eager["latency_b1_ms"].get("samples") or [], row["latency_b1_ms"].get("samples") or []
    if not a or not b or len(a) != len(b):
        ratio = row["latency_b1_ms"]["p50"] / eager["latency_b1_ms"]["p50"]
        return judge(ratio, NAN, NAN, why="rows without their call samples: no interval")
    ratio, lo, hi = bootstrap_ratio(a, b, paired=True)
    return judge(ratio, lo, hi, why="within one process")


def inference_table(rows: list[dict[str, Any]]) -> str:
    """Framework x variant: batch-1 latency p50/p99 with their intervals, p50 against eager with a verdict,
    throughput per batch with its interval, accuracy and its delta to eager fp32. Every interval is within the one
    process that measured the framework's variants (its calls are the samples)."""
    infer = [r for r in rows if r.get("command") == "infer"]
    batches = sorted({int(b) for r in infer for b in r.get("throughput", {})})
    unit = examples_unit({r["config"]["model"] for r in infer if "model" in r.get("config", {})})
    eager = {r["framework"]: r for r in infer if r.get("variant") == "eager" and r.get("status") == "ok"}
    columns = ["framework", "variant", "status", "batch-1 p50 ms [95% CI]", "batch-1 p99 ms [95% CI]",
               "p50 vs eager", "first call s", *[f"{unit}/s @{b} [95% CI]" for b in batches], "accuracy",
               "delta vs eager", "what it is here"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in infer:
        if row.get("status") != "ok":
            why = row.get("note") or row.get("error") or ""
            lines.append(f"| {row['framework']} | {row['variant']} | {row.get('status')} |" + " |" * (len(columns) - 4)
                         + f" {str(why)[:160]} |")
            continue
        latency = row["latency_b1_ms"]
        samples = latency.get("samples") or []
        chance = at_chance(row["accuracy"], row.get("num_classes"), row.get("eval_samples"))
        chance_text = " (chance level)" if chance else ""
        versus = against_eager(row, eager.get(row["framework"]))
        throughput = [_throughput_cell(row["throughput"].get(str(b), {})) for b in batches]
        lines.append("| " + " | ".join([row["framework"], row["variant"], "ok",
                                        _ms_interval(samples, 0.5, latency["p50"]),
                                        _ms_interval(samples, 0.99, latency["p99"]),
                                        versus.text() if versus is not None else "-", f"{row['first_call_s']:.2f}",
                                        *throughput, f"{row['accuracy']:.3f}{chance_text}",
                                        fmt(row.get("accuracy_delta", NAN), "{:+.3f}"), row.get("note", "")]) + " |")
    return "\n".join(lines)
