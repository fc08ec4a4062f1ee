"""``twinrun run``: one configuration, both frameworks (or one), paired initial weights, a side-by-side table."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common.config import add_config_arguments, config_from_args
from common.results import ResultStore
from common.versions import host_info
from experiments.paired import FRAMEWORKS, paired_config, run_framework


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--out", default="results/run")
    parser.add_argument("--timeout", type=float, default=3600.0)
    add_config_arguments(parser)


def summary_row(result: dict[str, Any]) -> dict[str, Any]:
    timing = result.get("timing", {})
    step = timing.get("step_s", {})
    return {
        "status": result.get("status"),
        "step_ms": step.get("median", float("nan")) * 1e3,
        "step_ms_p10_p90": (step.get("p10", float("nan")) * 1e3, step.get("p90", float("nan")) * 1e3),
        "images_per_s": timing.get("images_per_s"),
        "data_wait_pct": 100 * timing.get("data_wait_fraction", float("nan")),
        "first_step_s": timing.get("first_step_s"),
        "recompiles": result.get("recompiles"),
        "accuracy": None if result.get("synthetic_data") else result.get("eval", {}).get("accuracy"),
        "final_loss": (result.get("losses") or [None])[-1],
        "memory": result.get("memory", {}),
    }


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from experiments.defaults import with_default_data
    from experiments.plan import console_for_output

    config = config_from_args(args)
    config = with_default_data(config)
    out = Path(args.out)
    config = paired_config(config, out / "weights")
    store = ResultStore(out / "runs.jsonl")
    console = console_for_output()
    frameworks = FRAMEWORKS if args.framework == "both" else (args.framework,)
    rows = []
    for framework in frameworks:
        console.print(f"[bold]run[/] {framework} ...")
        started = time.time()
        result = run_framework(framework, config, args.timeout)
        row = {"key": f"run/{framework}/{int(started)}", "command": "run", "framework": framework,
               "config": config.to_dict(), "host": host_info(), **{k: v for k, v in result.items() if k != "traceback"}}
        rows.append(row)
        store.add(row)
    table = Table(title=f"{config.model} width={config.width} batch={config.batch_size} precision={config.precision} "
                        f"compile={config.compile}: median step over {rows[0].get('timing', {}).get('timed_steps', 0)} "
                        f"timed steps after {config.timing_warmup} warm-up (synchronized)")
    for column in ("framework", "status", "step ms (p10..p90)", "images/s", "data wait %", "first step s",
                   "recompiles", "final loss", "accuracy", "notes"):
        table.add_column(column)
    for row in rows:
        s = summary_row(row)
        if s["status"] != "ok":
            table.add_row(row["framework"], str(s["status"]), "", "", "", "", "", "", "", str(row.get("error", ""))[:200])
            continue
        accuracy = "n/a (synthetic)" if s["accuracy"] is None else f"{s['accuracy']:.3f}"
        if s["images_per_s"] is None:  # every step was a warm-up step: nothing steady to show
            table.add_row(row["framework"], "ok", "-", "-", "-", f"{s['first_step_s']:.2f}", str(s["recompiles"]),
                          f"{s['final_loss']:.4f}", accuracy, f"no timed steps: steps <= timing_warmup ({config.timing_warmup})")
            continue
        table.add_row(row["framework"], "ok", f"{s['step_ms']:.1f} ({s['step_ms_p10_p90'][0]:.1f}..{s['step_ms_p10_p90'][1]:.1f})",
                      f"{s['images_per_s']:.0f}", f"{s['data_wait_pct']:.1f}", f"{s['first_step_s']:.2f}",
                      str(s["recompiles"]), f"{s['final_loss']:.4f}", accuracy, "; ".join(row.get("notes", [])))
    console.print(table)
    return 0 if all(r.get("status") == "ok" for r in rows) else 1
