"""``twinrun report``: markdown tables and PNG plots from a results folder, with published figures beside ours."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from common.flops import train_step_flops
from common.results import ResultStore, atomic_write_text
from experiments import reference


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def aggregate(rows: list[dict[str, Any]], command: str, group_field: str, order_field: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(group, framework) -> aggregated over repeats: median of the per-run medians, and their spread.
    The group is the rung of a ladder or the value of a sweep."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("command") != command:
            continue
        cell = cells.setdefault((row[group_field], row["framework"]), {"order": row[order_field], "runs": [], "failed": 0})
        if row.get("status") == "ok":
            cell["runs"].append(row)
        else:
            cell["failed"] += 1
            cell["skipped"] = cell.get("skipped", 0) + (row.get("status") == "skipped")
            cell.setdefault("errors", []).append(str(row.get("error", row.get("status")))[:120])
    for cell in cells.values():
        runs = cell["runs"]
        steps = [r["timing"]["step_s"]["median"] for r in runs if "step_s" in r.get("timing", {})]
        cell["step_s"] = _median(steps)
        cell["step_spread"] = (min(steps), max(steps)) if steps else (float("nan"),) * 2
        cell["images_per_s"] = _median([r["timing"]["images_per_s"] for r in runs if "images_per_s" in r.get("timing", {})])
        cell["data_wait"] = _median([r["timing"]["data_wait_fraction"] for r in runs if "data_wait_fraction" in r.get("timing", {})])
        cell["first_step_s"] = _median([r["timing"]["first_step_s"] for r in runs if "first_step_s" in r.get("timing", {})])
        cell["accuracy"] = _median([r["eval"]["accuracy"] for r in runs if "eval" in r and not r.get("synthetic_data")])
        cell["saved_bytes"] = _median([r["memory"].get("saved_for_backward_bytes", float("nan")) for r in runs])
        cell["peak_bytes"] = _median([r["memory"].get("peak_allocated_bytes", float("nan")) for r in runs])
        cell["recompiles"] = max([r.get("recompiles", 0) for r in runs], default=0)
        cell["notes"] = sorted({n for r in runs for n in r.get("notes", [])})
        cell["config"] = runs[0]["config"] if runs else None
    return cells


def ladder_cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return aggregate(rows, "ladder", "rung", "rung_index")


def sweep_cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return aggregate(rows, "sweep", "value", "value_index")


def ordered_groups(cells: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return sorted({g for g, _ in cells}, key=lambda g: min(c["order"] for (h, _), c in cells.items() if h == g))


def _flops_per_step(config: dict[str, Any]) -> float:
    from common.config import RunConfig

    cfg = RunConfig.from_dict(config)
    # the global batch: every micro-batch of every replica
    return train_step_flops(cfg.arch(100), cfg.image_size, cfg.batch_size * cfg.grad_accum_steps * cfg.devices)


def _fmt(value: float, pattern: str) -> str:
    return "-" if value != value else pattern.format(value)  # NaN -> "-"


def results_table(cells: dict[tuple[str, str], dict[str, Any]], matmul_rate: float | None, group_title: str,
                  published: dict[str, str] | None = None) -> str:
    """Group x framework: step time (spread over repeats), speedup over the first group, throughput, data
    wait, compile, memory, accuracy, MFU; ``published`` adds the reference column (torch rows)."""
    groups = ordered_groups(cells)
    columns = [group_title, "framework", "step ms (min..max over repeats)", f"speedup vs {groups[0] if groups else '-'}",
               "images/s", "data wait %", "first step s", "recompiles", "saved for backward MB", "peak MB", "accuracy", "MFU %"]
    if published is not None:
        columns.append("published (min)")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for group in groups:
        for framework in ("torch", "jax"):
            cell = cells.get((group, framework))
            if cell is None:
                continue
            reference_cell = (published or {}).get(group, "") if framework == "torch" else ""
            if not cell["runs"]:
                what = "skipped" if cell.get("skipped") == cell["failed"] else f"failed ({cell['failed']} runs)"
                failed = f"{what}: {'; '.join(sorted(set(cell.get('errors', []))))[:150]}"
                lines.append(f"| {group} | {framework} | {failed} |" + " |" * (len(columns) - 3))
                continue
            base = cells.get((groups[0], framework), {}).get("step_s", float("nan"))
            flops = _flops_per_step(cell["config"])
            devices = cell["config"].get("devices", 1)  # each replica's device has the measured rate
            mfu = 100 * flops / cell["step_s"] / (matmul_rate * devices) if matmul_rate else float("nan")
            lo, hi = cell["step_spread"]
            values = [group, framework, f"{cell['step_s'] * 1e3:.1f} ({lo * 1e3:.1f}..{hi * 1e3:.1f})",
                      _fmt(base / cell["step_s"], "{:.2f}x"), _fmt(cell["images_per_s"], "{:.0f}"),
                      _fmt(100 * cell["data_wait"], "{:.1f}"), _fmt(cell["first_step_s"], "{:.2f}"), str(cell["recompiles"]),
                      _fmt(cell["saved_bytes"] / 1e6, "{:.1f}"), _fmt(cell["peak_bytes"] / 1e6, "{:.1f}"),
                      _fmt(cell["accuracy"], "{:.3f}"), _fmt(mfu, "{:.1f}")]
            if published is not None:
                values.append(reference_cell)
            lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def scaling_table(cells: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Throughput per replica count and scaling efficiency: images/s at N / (N x images/s at 1)."""
    lines = ["| replicas | framework | images/s (global batch) | speedup | scaling efficiency % |", "|---|---|---|---|---|"]
    for group in ordered_groups(cells):
        for framework in ("torch", "jax"):
            cell, single = cells.get((group, framework)), cells.get(("1", framework))
            if not cell or not cell["runs"]:
                continue
            base = single["images_per_s"] if single and single["runs"] else float("nan")
            speedup = cell["images_per_s"] / base
            lines.append(f"| {group} | {framework} | {cell['images_per_s']:.0f} | {_fmt(speedup, '{:.2f}x')} "
                         f"| {_fmt(100 * speedup / int(group), '{:.0f}')} |")
    return "Scaling (each replica keeps the preset's batch; on a CPU the replicas share its cores):\n\n" + "\n".join(lines)


def ladder_table(cells: dict[tuple[str, str], dict[str, Any]], matmul_rate: float | None) -> str:
    return results_table(cells, matmul_rate, "rung", published={k: f"{v:g}" for k, v in reference.MINUTES.items()})


def mapping_table() -> str:
    from experiments.ladder import RUNGS

    lines = ["| rung | adds | torch | JAX |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.adds} | {r.torch} | {r.jax} |" for r in RUNGS]
    return "\n".join(lines)


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


def plot_step_time(cells: dict[tuple[str, str], dict[str, Any]], path: Path, title: str) -> Path:
    plt = _pyplot()
    names = ordered_groups(cells)
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.38
    for offset, framework in ((-width / 2, "torch"), (width / 2, "jax")):
        values = [cells.get((n, framework), {}).get("step_s", float("nan")) * 1e3 for n in names]
        axis.bar([i + offset for i in range(len(names))], values, width, label=framework)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("median step time, ms (log)")
    axis.set_yscale("log")  # op-by-op JAX is ~30x slower than the rest: linear hides every other bar
    axis.set_title(title)
    axis.legend()
    return _save(figure, path)


def plot_data_wait(cells: dict[tuple[str, str], dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 4))
    labels, waits, computes = [], [], []
    for n in ordered_groups(cells):
        for framework in ("torch", "jax"):
            cell = cells.get((n, framework))
            if cell and cell["runs"]:
                step = cell["step_s"] * 1e3
                labels.append(f"{n}\n{framework}")
                waits.append(step * cell["data_wait"])
                computes.append(step * (1 - cell["data_wait"]))
    axis.bar(labels, computes, label="compute")
    axis.bar(labels, waits, bottom=computes, label="data wait")
    axis.set_ylabel("ms per step")
    axis.set_title("data wait vs compute")
    axis.legend()
    axis.tick_params(axis="x", labelsize=7)
    return _save(figure, path)


def plot_memory_vs_time(cells: dict[tuple[str, str], dict[str, Any]], path: Path, title: str) -> Path:
    """Each value of the sweep as a point: step time against memory (device peak where measured, else the
    bytes saved for backward), one line per framework."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    use_peak = any(c["peak_bytes"] == c["peak_bytes"] for c in cells.values() if c["runs"])
    for framework, marker in (("torch", "o"), ("jax", "s")):
        points = [(g, cells[(g, framework)]) for g in ordered_groups(cells) if (g, framework) in cells and cells[(g, framework)]["runs"]]
        xs = [c["step_s"] * 1e3 for _, c in points]
        ys = [(c["peak_bytes"] if use_peak else c["saved_bytes"]) / 1e6 for _, c in points]
        axis.plot(xs, ys, marker=marker, label=framework)
        for (group, _), x, y in zip(points, xs, ys):
            axis.annotate(group, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    axis.set_xlabel("median step time, ms")
    axis.set_ylabel(("peak device memory" if use_peak else "activations saved for backward") + ", MB")
    axis.set_title(title)
    axis.legend()
    return _save(figure, path)


def _method(rows: list[dict[str, Any]], precision_note: str) -> str:
    runs = [r for r in rows if r.get("status") == "ok" and r.get("command") in ("ladder", "sweep")]
    if not runs:
        return ""
    example = runs[0]
    timing = example.get("timing", {})
    return (f"Each cell: median over {max(r.get('repeat', 0) for r in runs) + 1} repeat(s), each a separate process, "
            f"of the per-run median step time over {timing.get('timed_steps')} timed steps after "
            f"{timing.get('warmup_steps')} warm-up step(s) (the first, with compilation, is the 'first step' column); "
            f"every step synchronized (torch.cuda.synchronize / jax.block_until_ready). Device: {example.get('device')}; "
            f"host: {example.get('host')}. Both frameworks start from the same transferred weights, read the same "
            f"batches in the same order, and use the same optimizer formulas; {precision_note}")


def _mfu_text(rate: float | None) -> str:
    return (f"MFU: analytic training FLOPs per step (3x forward, common/flops.py) / step time / measured fp32 matmul "
            f"rate of this device ({'%.1f GFLOP/s' % (rate / 1e9) if rate else 'not measured'}).")


def _notes_text(cells: dict[tuple[str, str], dict[str, Any]]) -> str:
    notes = sorted({n for c in cells.values() for n in c.get("notes", [])})
    return "## Notes (techniques accepted with no effect here)\n\n" + ("\n".join(f"- {n}" for n in notes) or "none")


def inference_table(rows: list[dict[str, Any]]) -> str:
    """Framework x variant: batch-1 latency p50/p99, throughput per batch, accuracy and its delta to eager fp32."""
    infer = [r for r in rows if r.get("command") == "infer"]
    batches = sorted({int(b) for r in infer for b in r.get("throughput", {})})
    columns = ["framework", "variant", "status", "batch-1 p50 ms", "batch-1 p99 ms", "first call s",
               *[f"images/s @{b}" for b in batches], "accuracy", "delta vs eager", "what it is here"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in infer:
        if row.get("status") != "ok":
            why = row.get("note") or row.get("error") or ""
            lines.append(f"| {row['framework']} | {row['variant']} | {row.get('status')} |" + " |" * (len(columns) - 4)
                         + f" {str(why)[:160]} |")
            continue
        latency = row["latency_b1_ms"]
        throughput = [_fmt(row["throughput"].get(str(b), {}).get("images_per_s", float("nan")), "{:.0f}") for b in batches]
        lines.append("| " + " | ".join([row["framework"], row["variant"], "ok", f"{latency['p50']:.2f}", f"{latency['p99']:.2f}",
                                        f"{row['first_call_s']:.2f}", *throughput, f"{row['accuracy']:.3f}",
                                        _fmt(row.get("accuracy_delta", float("nan")), "{:+.3f}"), row.get("note", "")]) + " |")
    return "\n".join(lines)


def plot_latency(rows: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    ok = [r for r in rows if r.get("command") == "infer" and r.get("status") == "ok"]
    figure, axis = plt.subplots(figsize=(9, 4))
    labels = [f"{r['variant']}\n{r['framework']}" for r in ok]
    p50 = [r["latency_b1_ms"]["p50"] for r in ok]
    p99 = [r["latency_b1_ms"]["p99"] for r in ok]
    axis.bar(labels, p50, label="p50")
    axis.scatter(labels, p99, color="black", marker="_", s=300, label="p99", zorder=3)
    axis.set_yscale("log")
    axis.set_ylabel("batch-1 latency, ms (log)")
    axis.set_title("inference latency per variant")
    axis.legend()
    axis.tick_params(axis="x", labelsize=7)
    return _save(figure, path)


def _inference_report(folder: Path, rows: list[dict[str, Any]]) -> tuple[list[str], str]:
    infer = [r for r in rows if r.get("command") == "infer"]
    example = infer[0]
    options, training = example.get("options", {}), example.get("training", {})
    table = inference_table(rows)
    plot_latency(rows, folder / "inference_latency.png")
    parts = [f"# twinrun inference report: {folder.name}",
             f"Batch-1 latency: {options.get('calls')} timed calls after {options.get('warmup')} warm-up ones (the "
             f"first call, with any compilation, is its own column); throughput: median of "
             f"{options.get('throughput_calls')} calls per batch size. Every call is a host batch in and host logits "
             f"out, so it is synchronized. Accuracy on the eval split ({example.get('eval_batches') or 'all'} batches of "
             f"128), delta against the same framework's eager fp32. Weights: {training}. Device: "
             f"{sorted({str(r.get('device')) for r in infer})}; host: {example.get('host')}.",
             table, "![latency](inference_latency.png)"]
    return parts, table


def write_report(folder: Path, console: Any = None) -> Path:
    """report.md (+ PNGs) for a results folder holding a ladder, a sweep or inference rows."""
    rows = ResultStore(folder / "runs.jsonl").rows()
    if any(r.get("command") == "infer" for r in rows):
        parts, table = _inference_report(folder, rows)
        path = folder / "report.md"
        atomic_write_text(path, "\n\n".join(parts) + "\n")
        if console is not None:
            console.print(table)
        return path
    rate = _matmul_rate(folder)
    if any(r.get("command") == "sweep" for r in rows):
        cells = sweep_cells(rows)
        example = next(r for r in rows if r.get("command") == "sweep")
        technique, knob = example["technique"], example["knob"]
        table = results_table(cells, rate, technique)
        mode = {"native": "torch eager, JAX jit (each framework's usual mode)", "eager": "both eager (JAX op by op)",
                "compiled": "torch.compile and jax.jit"}.get(example.get("mode", ""), "as the preset")
        parts = [f"# twinrun sweep report: {technique} ({folder.name})",
                 f"Varied: {knob}. Everything else as the preset; mode outside a compile sweep: {mode}.",
                 _method(rows, "matmul precision is fp32 'highest' on both."), table, _mfu_text(rate),
                 "Saved for backward: torch counts the distinct storages autograd keeps (saved-tensor hooks); JAX counts "
                 "the residuals of the linearized step (jax.ad_checkpoint), where one array kept for two uses counts "
                 "twice. Compare within a framework, not across."]
        if technique == "compile-mode":
            parts.append("jax.jit has no modes: JAX runs once, under `default`.")
        if technique == "scaling":
            parts.append(scaling_table(cells))
        parts.append(_notes_text(cells))
        images = []
        if cells:
            images.append(plot_step_time(cells, folder / "sweep_step_time.png", f"step time per {technique} value"))
            images.append(plot_data_wait(cells, folder / "sweep_data_wait.png"))
            if technique in ("checkpointing", "accumulation", "batch-size", "precision"):
                images.append(plot_memory_vs_time(cells, folder / "sweep_memory_vs_time.png", f"{technique}: memory vs time"))
        parts.append("\n\n".join(f"![{p.stem}]({p.name})" for p in images))
    else:
        cells = ladder_cells(rows)
        table = ladder_table(cells, rate)
        parts = [f"# twinrun ladder report: {folder.name}",
                 _method(rows, "matmul precision is fp32 'highest' on both until the flags rung."), table, _mfu_text(rate),
                 f"Published (min): minutes of training per rung from {reference.SOURCE}; it also quotes "
                 f"{reference.STEP_MS_TEXT} and {reference.GPU_UTILISATION_TEXT}. These are reference figures, not our "
                 f"measurements.",
                 "## What each rung means in each framework\n\n" + mapping_table(), _notes_text(cells)]
        if cells:
            plot_step_time(cells, folder / "ladder_step_time.png", "step time per rung")
            plot_data_wait(cells, folder / "ladder_data_wait.png")
        parts.append("![step time](ladder_step_time.png)\n\n![data wait](ladder_data_wait.png)")
    path = folder / "report.md"
    atomic_write_text(path, "\n\n".join(p for p in parts if p) + "\n")
    if console is not None:
        console.print(table)
    return path


def _matmul_rate(folder: Path) -> float | None:
    """The device's fp32 matmul rate, measured once per results folder in a torch-only process."""
    store = ResultStore(folder / "runs.jsonl")
    for row in store.rows():
        if row.get("key") == "device/matmul-rate" and row.get("status") == "ok":
            return float(row["flops_per_s"])
    from experiments.runner import run_isolated

    result = run_isolated("matmul-rate", {})
    if result.get("status") != "ok":
        return None
    store.add({"key": "device/matmul-rate", "command": "device", **result})
    return float(result["flops_per_s"])


def measure_matmul_rate() -> dict[str, Any]:
    import time

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = 4096 if device.type == "cuda" else 1024
    torch.set_float32_matmul_precision("highest")
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    times = []
    for _ in range(7):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    best = statistics.median(times[2:])
    return {"status": "ok", "flops_per_s": 2 * n**3 / best, "n": n, "device": str(device)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", default="results/ladder-cpu", help="a results folder holding runs.jsonl")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    folder = Path(args.folder)
    if not (folder / "runs.jsonl").exists():
        raise SystemExit(f"twinrun report: error: no results at {folder / 'runs.jsonl'}")
    print(f"report: {write_report(folder, console=Console(width=180))}")
    return 0
