"""Plans of (key, framework, config) jobs, run each in its own process into a results store: the loop the
ladder and the sweeps share (progress display, resume by key and settings, a failed run recorded and passed,
``--fresh`` only once the whole command is known to be valid), and the device's matmul rate measured once per
results folder beside the plan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from common.config import RunConfig
from common.errors import ConfigError
from common.results import RunRecord, RunResult
from common.store import ResultStore, run_settings
from common.versions import host_info
from experiments.catalog.defaults import default_archive
from experiments.catalog.presets import PRESETS
from experiments.catalog.rungs import RUNGS, rung_config, skip_reason
from experiments.catalog.sweeps import Sweep, mode_for
from experiments.execution.device import ensure_matmul_rate
from experiments.execution.frameworks import selected
from experiments.execution.paired import paired_config, run_framework

SHARED_WEIGHTS = "initial-weights"  # beside the results folders: digest-named .npz files, one per model and seed


@dataclass(frozen=True)
class PlannedRun:
    key: str  # unique in the store: a rerun skips a key that finished
    framework: str
    config: RunConfig
    label: str  # shown in the progress display
    command: str  # the row's command: ladder, sweep
    fields: dict[str, Any] = field(default_factory=dict)  # extra row columns (rung, sweep value, repeat, ...)
    skip_reason: str | None = None  # recorded as a "skipped" row, not run (a combination the engines lack)


@dataclass(frozen=True)
class PlanOptions:
    """What the ladder and the sweeps are asked for on the command line (their shared flags)."""

    preset: str = "cpu"
    framework: str = "both"
    data: str | None = None
    steps: int | None = None
    repeats: int = 3
    name: str | None = None  # results folder name; default: the command's own
    results: str = "results"
    fresh: bool = False  # move earlier results aside (after validation, in ``execute``) and start over
    devices: int | None = None  # default: one per process
    processes: int = 1


@dataclass(frozen=True)
class Prepared:
    base: RunConfig  # the preset's config, paired: every run starts from the same transferred weights
    out: Path
    store: ResultStore
    frameworks: tuple[str, ...]


def prepare(options: PlanOptions, default_name: str) -> Prepared:
    """The preset's base config, the results folder and its store (checked writable); the base is not paired yet
    (``with_paired_weights``), so a bad value is refused before the weights are made."""
    if options.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    preset = dict(PRESETS[options.preset])
    if options.steps is not None:
        preset["steps"] = options.steps
    preset.update(devices=options.devices or options.processes, processes=options.processes)
    base = RunConfig(data=options.data or str(default_archive("cifar100")), **preset)
    out = Path(options.results) / (options.name or default_name)
    store = ResultStore(out)
    store.check_writable()
    return Prepared(base, out, store, selected(options.framework))


def with_paired_weights(prepared: Prepared) -> Prepared:
    """``prepared`` whose base starts from the shared initial weights, made once per model and seed for every
    results folder under the same ``--results`` (a ladder and its sweeps then start from the same weights)."""
    return replace(prepared, base=paired_config(prepared.base, prepared.out.parent / SHARED_WEIGHTS))


def ladder_plan(prepared: Prepared, repeats: int, preset: str, workers: int, cuda: bool,
                inject_failure: str | None = None) -> list[PlannedRun]:
    """Every rung x framework x repeat; ``inject_failure`` ("rung:framework", a test hook) makes that run die."""
    plan = []
    for repeat in range(repeats):
        for index, rung in enumerate(RUNGS):
            for framework in prepared.frameworks:
                config = rung_config(rung, prepared.base, framework, cuda, workers)
                if inject_failure == f"{rung.name}:{framework}":
                    config = config.replace(fail_after_step=1)
                plan.append(PlannedRun(
                    key=f"ladder/{rung.name}/{framework}/r{repeat}", framework=framework, config=config,
                    label=f"{rung.name:>8} {framework:<5} repeat {repeat + 1}/{repeats}", command="ladder",
                    fields={"rung": rung.name, "rung_index": index, "repeat": repeat, "preset": preset},
                    skip_reason=skip_reason(config, framework)))
    return plan


def sweep_plan(sweep: Sweep, values: list[str], base: RunConfig, frameworks: tuple[str, ...],
               repeats: int, preset: str, compile_option: str = "native") -> list[PlannedRun]:
    """Every value x framework x repeat; a value with no meaning in a framework is left out for it."""
    plan = []
    for repeat in range(repeats):
        for index, value in enumerate(values):
            for framework in frameworks:
                changes = sweep.overrides(value, base, framework)
                if changes is None:
                    continue
                plan.append(PlannedRun(
                    key=f"sweep/{sweep.name}/{value}/{framework}/r{repeat}", framework=framework,
                    config=base.replace(**{"compile": mode_for(compile_option, framework), **changes}),
                    label=f"{sweep.name}={value} {framework:<5} repeat {repeat + 1}/{repeats}", command="sweep",
                    fields={"technique": sweep.name, "knob": sweep.knob, "value": value, "value_index": index,
                            "repeat": repeat, "preset": preset, "mode": compile_option}))
    return plan


def run_job(job: PlannedRun, timeout_s: float | None) -> RunRecord:
    """One planned job, run in its own process (or recorded as skipped), as the row to store."""
    started = time.time()
    if job.skip_reason:
        result = RunResult(framework=job.framework, status="skipped", error=job.skip_reason)
    else:
        result = run_framework(job.framework, job.config, timeout_s)
    return RunRecord(key=job.key, command=job.command, result=result, config=job.config.to_dict(), host=host_info(),
                     wall_s=time.time() - started, fields=dict(job.fields))


@dataclass(frozen=True)
class Outcome:
    """How a plan ended: the keys of its jobs that did not finish (failed or timed out), each with its error."""

    planned: int
    failed: dict[str, str]

    @property
    def complete(self) -> bool:
        return not self.failed


def execute(plan: list[PlannedRun], store: ResultStore, title: str, timeout_s: float | None, console: Console,
            fresh: bool = False) -> Outcome:
    """Runs the jobs whose keys have not finished with these settings, storing each row as it ends; then the
    device's matmul rate, once per results folder (the report reads it, never measures it). ``fresh``: the
    folder's earlier results are moved aside first (the caller has validated everything by now)."""
    host = host_info()
    moved = store.start({job.key: run_settings(job.config.to_dict(), host) for job in plan}, fresh)
    if moved:
        console.print(f"earlier results moved to {moved}")
    finished = store.finished_keys()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(title, total=len(plan))
        for job in plan:
            if job.key not in finished:
                progress.update(task, description=job.label)
                record = run_job(job, timeout_s)
                store.add(record.to_row())
                if record.status not in ("ok", "skipped"):
                    progress.console.print(f"[red]{job.key} {record.status}[/]: {str(record.result.error or '')[:300]}")
            progress.advance(task)
        progress.update(task, description="device matmul rate")
        ensure_matmul_rate(store, timeout_s)
    store.export()  # even when nothing ran: an export changed by hand is kept aside and written anew
    rows = {row["key"]: row for row in store.rows()}
    failed = {job.key: str(rows.get(job.key, {}).get("error") or "no row") for job in plan
              if rows.get(job.key, {}).get("status") not in ("ok", "diverged", "skipped")}
    return Outcome(len(plan), failed)


def outcome_line(outcome: Outcome) -> str:
    """The last line of a ladder or sweep: whether everything asked for ran (the exit code says the same)."""
    if outcome.complete:
        return f"all {outcome.planned} planned runs finished (ok, diverged or skipped with a reason)"
    keys = ", ".join(list(outcome.failed)[:5]) + (" ..." if len(outcome.failed) > 5 else "")
    return (f"{len(outcome.failed)} of {outcome.planned} planned runs failed ({keys}); rerun the same command to "
            f"retry them (finished runs are kept)")
