"""report.md and its PNG plots for a results folder holding a ladder, a sweep or inference rows, with the
published figures beside ours. Reads the folder's rows only: the device's matmul rate is the row the ladder
and the sweeps stored ("device/matmul-rate"); without it MFU is "not measured"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.results import RunRecord
from common.store import ResultsError, ResultStore, atomic_write_text
from experiments.catalog import reference
from experiments.catalog.rows import MATMUL_RATE_KEY
from experiments.reporting.cells import Cells, ladder_cells, sweep_cells
from experiments.reporting.plots import plot_data_wait, plot_latency, plot_memory_vs_time, plot_step_time
from experiments.reporting.tables import inference_table, ladder_table, mapping_table, results_table, scaling_table

MODES = {"native": "torch eager, JAX jit (each framework's usual mode)", "eager": "both eager (JAX op by op)",
         "compiled": "torch.compile and jax.jit"}
MEMORY_SWEEPS = ("checkpointing", "accumulation", "batch-size", "precision")


@dataclass(frozen=True)
class Report:
    path: Path  # report.md
    table: str  # its main table (markdown), for the console


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
    infer = [r for r in rows if r.get("command") == "infer"]
    example = infer[0]
    options, training = example.get("options", {}), example.get("training", {})
    table = inference_table(rows)
    plot = plot_latency(rows, folder / "inference_latency.png")
    parts = [f"# twinrun inference report: {folder.name}",
             f"Batch-1 latency: {options.get('calls')} timed calls after {options.get('warmup')} warm-up ones (the "
             f"first call, with any compilation, is its own column); throughput: median of "
             f"{options.get('throughput_calls')} calls per batch size. Every call is a host batch in and host logits "
             f"out, so it is synchronized. Accuracy on the eval split ({example.get('eval_batches') or 'all'} batches "
             f"of 128), delta against the same framework's eager fp32. Weights: {training}. Device: "
             f"{sorted({str(r.get('device')) for r in infer})}; host: {example.get('host')}.",
             table, _images([plot])]
    return parts, table


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
    parts.append(_notes_text(cells))
    images = [plot_step_time(cells, folder / "sweep_step_time.png", f"step time per {technique} value"),
              plot_data_wait(cells, folder / "sweep_data_wait.png")]
    if technique in MEMORY_SWEEPS:
        images.append(plot_memory_vs_time(cells, folder / "sweep_memory_vs_time.png", f"{technique}: memory vs time"))
    parts.append(_images(images))
    return parts, table


def _ladder_parts(folder: Path, records: list[RunRecord], rate: float | None) -> tuple[list[str], str]:
    cells = ladder_cells(records)
    table = ladder_table(cells, rate)
    parts = [f"# twinrun ladder report: {folder.name}",
             _method(records, "matmul precision is fp32 'highest' on both until the flags rung."), table,
             _mfu_text(rate),
             f"Published (min): minutes of training per rung from {reference.SOURCE}; it also quotes "
             f"{reference.STEP_MS_TEXT} and {reference.GPU_UTILISATION_TEXT}. These are reference figures, not our "
             f"measurements.",
             "## What each rung means in each framework\n\n" + mapping_table(), _notes_text(cells)]
    parts.append(_images([plot_step_time(cells, folder / "ladder_step_time.png", "step time per rung"),
                          plot_data_wait(cells, folder / "ladder_data_wait.png")]))
    return parts, table


def _images(paths: list[Path | None]) -> str:
    """The plots that were drawn, as markdown images; a line saying why there are none."""
    drawn = [p for p in paths if p is not None]
    if not drawn:
        return "No plots: no run in this folder finished (the table gives each run's error)."
    return "\n\n".join(f"![{p.stem}]({p.name})" for p in drawn)


def write_report(folder: Path) -> Report:
    """report.md (+ PNGs) for a results folder holding a ladder, a sweep or inference rows."""
    store = ResultStore(folder)
    rows = store.rows()
    if not rows:
        raise ResultsError(f"no results in {folder} (neither {store.path.name} nor {store.jsonl.name})")
    if any(r.get("command") == "infer" for r in rows):
        parts, table = _inference_parts(folder, rows)
    else:
        records = [r for r in store.records() if r.command in ("ladder", "sweep")]
        rate = matmul_rate(rows)
        if any(r.command == "sweep" for r in records):
            parts, table = _sweep_parts(folder, records, rate)
        else:
            parts, table = _ladder_parts(folder, records, rate)
    path = folder / "report.md"
    atomic_write_text(path, "\n\n".join(p for p in parts if p) + "\n")
    return Report(path, table)
