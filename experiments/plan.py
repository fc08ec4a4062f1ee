"""Runs a plan of (key, framework, config) jobs, each in its own process, into a results store: the loop
the ladder and the sweeps share (progress display, resume by key, a failed run recorded and passed)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.config import RunConfig
from common.errors import ConfigError
from common.results import ResultStore
from common.versions import host_info
from experiments.paired import FRAMEWORKS, paired_config, run_framework


@dataclass(frozen=True)
class PlannedRun:
    key: str  # unique in the store: a rerun skips a key that finished
    framework: str
    config: RunConfig
    label: str  # shown in the progress display
    fields: dict[str, Any] = field(default_factory=dict)  # extra row columns (rung, sweep value, repeat, ...)
    skip_reason: str | None = None  # recorded as a "skipped" row, not run (a combination the engines lack)


def add_plan_arguments(parser: Any, default_name: str) -> None:
    """The arguments the ladder and the sweeps share."""
    from experiments.ladder import PRESETS

    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--data", default=None, help="CIFAR archive/folder; default: a generated CIFAR-100-format archive")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default=None, help=f"results folder name (default: {default_name})")
    parser.add_argument("--results", default="results")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows and start over")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one run")
    parser.add_argument("--devices", type=int, default=None,
                        help="data-parallel replicas, batch size per replica (torch: DDP processes; JAX: devices); "
                             "default: one per process")
    parser.add_argument("--processes", type=int, default=1, help="JAX processes the devices are spread over (jax.distributed)")


@dataclass(frozen=True)
class Prepared:
    base: RunConfig  # the preset's config, paired: every run starts from the same transferred weights
    out: Path
    store: ResultStore
    frameworks: tuple[str, ...]


def prepare(args: Any, default_name: str) -> Prepared:
    from experiments.defaults import default_archive
    from experiments.ladder import PRESETS

    if args.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    preset = dict(PRESETS[args.preset])
    if args.steps is not None:
        preset["steps"] = args.steps
    preset.update(devices=args.devices or args.processes, processes=args.processes)
    base = RunConfig(data=args.data or str(default_archive("cifar100")), **preset)
    out = Path(args.results) / (args.name or default_name)
    store = ResultStore(out / "runs.jsonl")
    if args.fresh:
        store.clear()
    frameworks = FRAMEWORKS if args.framework == "both" else (args.framework,)
    return Prepared(paired_config(base, out / "weights"), out, store, frameworks)


def console_for_output() -> Any:
    from rich.console import Console

    return Console(width=None if Console().is_terminal else 180)


def execute(plan: list[PlannedRun], store: ResultStore, title: str, timeout_s: float, console: Any) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    finished = store.finished_keys()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(title, total=len(plan))
        for job in plan:
            if job.key in finished:
                progress.advance(task)
                continue
            progress.update(task, description=job.label)
            started = time.time()
            if job.skip_reason:
                result = {"status": "skipped", "error": job.skip_reason}
            else:
                result = run_framework(job.framework, job.config, timeout_s)
            row = {"key": job.key, **job.fields, "framework": job.framework, "config": job.config.to_dict(),
                   "host": host_info(), "wall_s": time.time() - started,
                   **{k: v for k, v in result.items() if k != "traceback"}}
            store.add(row)
            if row["status"] not in ("ok", "skipped"):
                progress.console.print(f"[red]{job.key} {row['status']}[/]: {str(row.get('error', ''))[:300]}")
            progress.advance(task)
