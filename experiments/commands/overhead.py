"""``twinrun overhead``: our trainer's steady-state step against a minimal hand-written loop on the same model
and batches, per framework, in one process run (how: experiments/execution/overhead.py)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from common.config import RunConfig
from common.workloads import workload_for
from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.frameworks import selected
from experiments.execution.overhead import GOAL, measure_isolated, overhead_config
from experiments.execution.paired import paired_config
from experiments.execution.preflight import check_runnable
from experiments.execution.store import atomic_write_text, writable_folder
from experiments.options import add_framework_argument, add_timeout_argument, console_for_output
from experiments.reporting.stats import Comparison, bootstrap_ratio, judge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--out", default="results/overhead", help="folder of overhead.json and the paired weights")
    add_timeout_argument(parser, 1800.0, "each framework's measurement")
    add_config_arguments(parser)


def judged(result: dict[str, Any]) -> tuple[Comparison, str]:
    """The trainer's step against the minimal loop's (a bootstrap of the ratio of their medians over the steps of
    this one process, seeded), and whether it keeps the goal: "within goal" when the whole interval is at most GOAL,
    "above goal" when it is all above, otherwise "undecided"."""
    ratio, lo, hi = bootstrap_ratio(result.get("minimal_samples_s") or [], result.get("trainer_samples_s") or [])
    if not math.isfinite(lo):  # rows without their samples: the point ratio alone
        ratio = result["ratio"]
    comparison = judge(ratio, lo, hi, why="within one process")
    goal = ("within goal" if hi <= GOAL else "above goal" if lo > GOAL else "undecided (the interval spans the goal)"
            ) if math.isfinite(hi) else ("within goal" if ratio <= GOAL else "above goal") + " (no interval)"
    return comparison, goal


def _table(config: RunConfig, results: list[dict[str, Any]]) -> Table:
    model = workload_for(config.model).summary(config)
    table = Table(title=f"trainer vs minimal loop: {model} batch={config.batch_size} "
                        f"precision={config.precision} compile={config.compile}; median of synchronized steps "
                        f"(device batch -> loss on host), goal <= {GOAL}; 95% intervals over this process's steps")
    for column in ("framework", "trainer ms (p10..p90)", "minimal loop ms (p10..p90)", "ratio [95% CI]",
                   "trainer vs minimal loop", "goal"):
        table.add_column(column)
    for result in results:
        if result.get("status") != "ok":
            table.add_row(result["framework"], "failed", "", "", "", str(result.get("error", ""))[:200])
            continue
        t, m = result["trainer_compute_s"], result["minimal_s"]
        comparison, goal = judged(result)
        bounds = f" [{comparison.lo:.3f}, {comparison.hi:.3f}]" if math.isfinite(comparison.lo) else ""
        table.add_row(result["framework"], f"{t['median'] * 1e3:.2f} ({t['p10'] * 1e3:.2f}..{t['p90'] * 1e3:.2f})",
                      f"{m['median'] * 1e3:.2f} ({m['p10'] * 1e3:.2f}..{m['p90'] * 1e3:.2f})",
                      f"{comparison.ratio:.3f}{bounds}", comparison.text(), goal)
    return table


def run(args: argparse.Namespace) -> int:
    config = overhead_config(config_from_args(args), args.steps is not None)
    frameworks = selected(args.framework, config.model)
    check_runnable(config, frameworks)
    writable_folder(args.out, "--out")
    config = paired_config(config, Path(args.out) / "weights")  # one starting point for both frameworks
    results = [measure_isolated(framework, config, args.timeout) for framework in frameworks]
    for result in results:
        if result.get("status") == "ok":
            comparison, goal = judged(result)
            result["verdict"] = {"ratio": comparison.ratio, "lo": comparison.lo, "hi": comparison.hi,
                                 "text": comparison.text(), "goal": goal}
    console_for_output().print(_table(config, results))
    text = json.dumps({"config": config.to_dict(), "results": results}, indent=1, default=str)
    atomic_write_text(Path(args.out) / "overhead.json", text)
    return 0 if all(r.get("status") == "ok" for r in results) else 1
