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


def ladder_cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(rung, framework) -> aggregated over repeats: median of the per-run medians, and their spread."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("command") != "ladder":
            continue
        cell = cells.setdefault((row["rung"], row["framework"]), {"rung_index": row["rung_index"], "runs": [], "failed": 0})
        if row.get("status") == "ok":
            cell["runs"].append(row)
        else:
            cell["failed"] += 1
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


def _flops_per_step(config: dict[str, Any]) -> float:
    from common.config import RunConfig

    cfg = RunConfig.from_dict(config)
    return train_step_flops(cfg.arch(100), cfg.image_size, cfg.batch_size * cfg.grad_accum_steps)


def _fmt(value: float, pattern: str) -> str:
    return "-" if value != value else pattern.format(value)  # NaN -> "-"


def ladder_table(cells: dict[tuple[str, str], dict[str, Any]], matmul_rate: float | None) -> str:
    from experiments.ladder import RUNGS

    lines = ["| rung | framework | step ms (min..max over repeats) | speedup | images/s | data wait % | first step s "
             "| recompiles | saved for backward MB | peak MB | accuracy | MFU % | published (min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rung in RUNGS:
        for framework in ("torch", "jax"):
            cell = cells.get((rung.name, framework))
            if cell is None:
                continue
            base = cells.get(("baseline", framework), {}).get("step_s", float("nan"))
            if not cell["runs"]:
                lines.append(f"| {rung.name} | {framework} | failed ({cell['failed']} runs): {'; '.join(cell.get('errors', []))[:150]} "
                             "| | | | | | | | | | |")
                continue
            flops = _flops_per_step(cell["config"])
            mfu = 100 * flops / cell["step_s"] / matmul_rate if matmul_rate else float("nan")
            lo, hi = cell["step_spread"]
            lines.append(
                f"| {rung.name} | {framework} | {cell['step_s'] * 1e3:.1f} ({lo * 1e3:.1f}..{hi * 1e3:.1f}) "
                f"| {_fmt(base / cell['step_s'], '{:.2f}x')} | {_fmt(cell['images_per_s'], '{:.0f}')} "
                f"| {_fmt(100 * cell['data_wait'], '{:.1f}')} | {_fmt(cell['first_step_s'], '{:.2f}')} | {cell['recompiles']} "
                f"| {_fmt(cell['saved_bytes'] / 1e6, '{:.1f}')} | {_fmt(cell['peak_bytes'] / 1e6, '{:.1f}')} "
                f"| {_fmt(cell['accuracy'], '{:.3f}')} | {_fmt(mfu, '{:.1f}')} "
                f"| {reference.MINUTES[rung.name] if framework == 'torch' else ''} |")
    return "\n".join(lines)


def mapping_table() -> str:
    from experiments.ladder import RUNGS

    lines = ["| rung | adds | torch | JAX |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.adds} | {r.torch} | {r.jax} |" for r in RUNGS]
    return "\n".join(lines)


def plot_ladder(cells: dict[tuple[str, str], dict[str, Any]], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.ladder import RUNGS

    names = [r.name for r in RUNGS if any((r.name, f) in cells for f in ("torch", "jax"))]
    paths = []
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.38
    for offset, framework in ((-width / 2, "torch"), (width / 2, "jax")):
        values = [cells.get((n, framework), {}).get("step_s", float("nan")) * 1e3 for n in names]
        axis.bar([i + offset for i in range(len(names))], values, width, label=framework)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("median step time, ms (log)")
    axis.set_yscale("log")  # op-by-op JAX is ~30x slower than the rest: linear hides every other bar
    axis.set_title("step time per rung")
    axis.legend()
    paths.append(folder / "ladder_step_time.png")
    figure.tight_layout()
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(9, 4))
    labels, waits, computes = [], [], []
    for n in names:
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
    paths.append(folder / "ladder_data_wait.png")
    figure.tight_layout()
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)
    return paths


def write_report(folder: Path, console: Any = None) -> Path:
    rows = ResultStore(folder / "runs.jsonl").rows()
    cells = ladder_cells(rows)
    rate = _matmul_rate(folder)
    runs = [r for r in rows if r.get("status") == "ok"]
    method = ""
    if runs:
        example = runs[0]
        timing = example.get("timing", {})
        method = (f"Each cell: median over {max(r.get('repeat', 0) for r in rows) + 1} repeat(s), each a separate process, "
                  f"of the per-run median step time over {timing.get('timed_steps')} timed steps after "
                  f"{timing.get('warmup_steps')} warm-up step(s) (the first, with compilation, is the 'first step' column); "
                  f"every step synchronized (torch.cuda.synchronize / jax.block_until_ready). Device: {example.get('device')}; "
                  f"host: {example.get('host')}. Both frameworks start from the same transferred weights, read the same "
                  f"batches in the same order, and use the same optimizer formulas; matmul precision is fp32 'highest' on "
                  f"both until the flags rung.")
    notes = sorted({n for c in cells.values() for n in c.get("notes", [])})
    text = "\n\n".join([
        f"# twinrun ladder report: {folder.name}",
        method,
        ladder_table(cells, rate),
        f"MFU: analytic training FLOPs per step (3x forward, common/flops.py) / step time / measured fp32 matmul "
        f"rate of this device ({'%.1f GFLOP/s' % (rate / 1e9) if rate else 'not measured'}).",
        f"Published (min): minutes of training per rung from {reference.SOURCE}; it also quotes "
        f"{reference.STEP_MS_TEXT} and {reference.GPU_UTILISATION_TEXT}. These are reference figures, not our measurements.",
        "## What each rung means in each framework\n\n" + mapping_table(),
        "## Notes (techniques accepted with no effect here)\n\n" + ("\n".join(f"- {n}" for n in notes) or "none"),
        "![step time](ladder_step_time.png)\n\n![data wait](ladder_data_wait.png)",
    ])
    if cells:
        plot_ladder(cells, folder)
    path = folder / "report.md"
    atomic_write_text(path, text + "\n")
    if console is not None:
        console.print(ladder_table(cells, rate))
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
