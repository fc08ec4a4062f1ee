"""Plans of (key, framework, config) jobs, run each in its own process into a results store: the loop the
ladder and the sweeps share (progress display, resume by key and settings, a failed run recorded and passed,
``--fresh`` only once the whole command is known to be valid), and the device's matmul rate measured once per
results folder beside the plan."""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from common.config import RunConfig
from common.data.cifar import LAYOUTS
from common.errors import ConfigError
from common.results import RunResult
from common.workloads import workload_for
from experiments.catalog.defaults import default_archive, default_text_folder
from experiments.catalog.presets import preset_settings
from experiments.catalog.rows import AA, AA_SUFFIX, ADAPTIVE_COMMAND, ADAPTIVE_KEY, configuration_of
from experiments.catalog.rungs import (
    DEFAULT_ORDER,
    LOADER_FIELDS,
    Device,
    Rung,
    ladder_rungs,
    rung_config,
    skip_reason,
)
from experiments.catalog.sweeps import Sweep, mode_for, reference_value
from experiments.execution.device import ensure_matmul_rate
from experiments.execution.frameworks import selected
from experiments.execution.host import host_info
from experiments.execution.paired import paired_config, run_framework
from experiments.execution.preflight import check_runnable
from experiments.execution.record import RunRecord
from experiments.execution.store import FINISHED, ResultStore, run_settings

DEFAULT_ACCURACY_EPOCHS = 5  # the ladder's epochs when --to-accuracy is given without --epochs
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
    cache: str | None = None  # the folder of the run's compile caches (inductor, JAX's persistent cache)
    cold: bool = True  # empty ``cache`` before the run, so its first step is a cold compile


@dataclass(frozen=True)
class PlanOptions:
    """What the ladder and the sweeps are asked for on the command line (their shared flags)."""

    preset: str = "cpu"
    model: str | None = None  # None: the preset's; another family's model takes its recipe (presets.FAMILY_RECIPES)
    framework: str = "both"
    source: str = "cifar100"
    data: str | None = None
    steps: int | None = None
    repeats: int = 3
    name: str | None = None  # results folder name; default: the command's own
    results: str = "results"
    fresh: bool = False  # move earlier results aside (after validation, in ``execute``) and start over
    devices: int | None = None  # default: one per process
    processes: int = 1
    read_latency_ms: float = 0.0  # simulated slow storage on every run (a planted input-bound loader)
    torchcompile_backend: str = "inductor"  # torch.compile's backend in every compiled torch run
    control: bool = True  # the A/A control (the reference once more in every repeat): the verdicts' noise floor


@dataclass(frozen=True)
class Prepared:
    base: RunConfig  # the preset's config, paired: every run starts from the same transferred weights
    out: Path
    store: ResultStore
    frameworks: tuple[str, ...]
    control: bool = True  # PlanOptions.control


def prepare(options: PlanOptions, default_name: str) -> Prepared:
    """The preset's base config, the results folder and its store (checked writable); the base is not paired yet
    (``with_paired_weights``), so a bad value is refused before the weights are made."""
    if options.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    preset = preset_settings(options.preset, options.model)
    if options.steps is not None:
        preset["steps"] = options.steps
    preset.update(devices=options.devices or options.processes, processes=options.processes,
                  read_latency_ms=options.read_latency_ms, torchcompile_backend=options.torchcompile_backend)
    data, source = options.data, options.source
    if workload_for(preset["model"]).family == "text":  # a text model reads text: --data or the generated AG News
        source, data = "text", data or str(default_text_folder())
    elif data is None and source in LAYOUTS:  # CIFAR: a generated archive; mnist5k: the installed file
        data = str(default_archive(source))
    # absolute: the rows' configs, and the `twinrun run` command the report recommends, hold wherever they are read
    data = str(Path(data).absolute()) if data else None
    base = RunConfig(source=source, data=data, **preset)
    out = Path(options.results) / (options.name or default_name)
    store = ResultStore(out)
    store.check_writable()
    store.rows()  # a damaged store is named now, before weights are made or data is read
    return Prepared(base, out, store, selected(options.framework, base.model), options.control)


def with_paired_weights(prepared: Prepared) -> Prepared:
    """``prepared`` whose base starts from the shared initial weights, made once per model and seed for every
    results folder under the same ``--results`` (a ladder and its sweeps then start from the same weights)."""
    return replace(prepared, base=paired_config(prepared.base, prepared.out.parent / SHARED_WEIGHTS))


@dataclass(frozen=True)
class LadderOptions:
    """What the ladder adds to the shared plan flags."""

    device: Device  # CUDA or not (mixed precision's dtype) and the loader rung's worker count
    order: tuple[str, ...] = DEFAULT_ORDER  # the techniques, in the order the cumulative rungs add them
    ablations: bool = True  # also "top rung minus X" for each technique X
    # the repeats that measure the ablations (None: every one): each is a comparison with the top rung, judged with
    # its framework's pooled run-to-run spread, so one run of it decides as a cumulative rung's two do; the adaptive
    # step adds runs of any still undecided
    ablation_repeats: int | None = None
    to_accuracy: float | None = None  # train whole epochs until the evaluation accuracy reaches this
    epochs: int | None = None  # at most this many epochs (with to_accuracy), or exactly this many
    inject_failure: str | None = None  # test hook, "rung:framework": that run dies
    break_lr: str | None = None  # test hook, a rung name: its LR is broken (1e-6), a planted accuracy drop


Configuration = tuple[str, str]  # (group, framework): a rung or sweep value (the A/A duplicate apart) in a framework


def ladder_plan(prepared: Prepared, repeats: int, preset: str, options: LadderOptions,
                order_seed: int = 0) -> list[PlannedRun]:
    """Every rung (cumulative, then the ablations) and the A/A control (unless ``prepared.control`` is False) x
    framework x repeat, each repeat in its own seeded random order (``ordered``). Each (rung, framework) has a
    compile cache of its own; the first run to use one in the job starts it empty (a cold compile, measured), later
    runs read it (said in the row's ``cache`` field and in the report). With ``to_accuracy``/``epochs`` each repeat
    has its own seed (its own initial weights and batch order, the same in both frameworks), so the spread over
    repeats is real."""
    jobs = [job for repeat in range(repeats) for job in ladder_repeat(prepared, repeat, f"{repeat + 1}/{repeats}",
                                                                     preset, options)]
    return ordered(jobs, order_seed)


def ladder_repeat(prepared: Prepared, repeat: int, counted: str, preset: str, options: LadderOptions,
                  only: set[Configuration] | None = None) -> list[PlannedRun]:
    """One repeat of the ladder, in plan order (``ordered`` shuffles it): every rung and the A/A control (the top
    rung once more; none when ``prepared.control`` is False) in each framework; ``only``: just these configurations
    (an adaptive repeat)."""
    plan = []
    ablations = options.ablations and (only is not None or options.ablation_repeats is None
                                       or repeat < options.ablation_repeats)
    rungs = ladder_rungs(options.order, ablations)
    top = rungs[len(options.order)]
    base = repeat_base(prepared, repeat, options)
    caches = _cache_names(rungs, [rung_config(rung, base, options.device) for rung in rungs])
    for rung, control in [*((r, None) for r in rungs), *([(top, AA)] if prepared.control else [])]:
        group = rung.name + (AA_SUFFIX if control else "")
        for framework in prepared.frameworks:
            if only is not None and (group, framework) not in only:
                continue
            config = rung_config(rung, base, options.device)
            if options.inject_failure == f"{rung.name}:{framework}" and not control:
                config = config.replace(fail_after_step=1)
            if options.break_lr == rung.name:
                config = config.replace(lr=1e-6)
            # one TensorBoard run per rung, repeat and framework (the writer adds the framework's folder)
            config = config.replace(tensorboard_dir=str(prepared.out / "tensorboard" / f"{group}-r{repeat}"))
            title = f"{rung.title} (A/A)" if control else rung.title
            plan.append(PlannedRun(
                key=f"ladder/{group}/{framework}/r{repeat}", framework=framework, config=config,
                label=f"{title:>16} {framework:<5} repeat {counted}", command="ladder",
                fields={"rung": rung.name, "rung_index": rung.index, "ablation": rung.ablation,
                        "techniques": list(rung.techniques), "repeat": repeat, "preset": preset,
                        **({"control": control} if control else {})},
                skip_reason=skip_reason(config, framework),
                cache=str(prepared.out / "compile-cache" / f"{caches[rung.name]}-{framework}")))
    return plan


def _program_key(config: RunConfig) -> str:
    """What a compile cache holds the compilations of: the run's config without its input pipeline's knobs (the
    loader rung's: they change no compiled program) and where its scalars go."""
    fields = config.to_dict()
    for name in (*LOADER_FIELDS, "tensorboard_dir"):
        fields.pop(name, None)
    return json.dumps(fields, sort_keys=True, default=str)


def _cache_names(rungs: list[Rung], configs: list[RunConfig]) -> dict[str, str]:
    """Each rung's compile cache. A cumulative rung has its own, so every one of them compiles cold in repeat 0 and
    reads its cache after, alike: a run that compiled cold may step at another pace than one that read a cache (JAX
    op by op, one job here: 822-880 ms a step in the cold runs, 517-614 ms in the warm ones), and the rungs are
    compared with each other. An ablation reads the cache of the first rung (in ladder order) that compiles its
    program, as the A/A control does: top minus loader the top rung's (the loader changes no program). Top minus
    flags compiles another program in both frameworks: JAX writes the precision into every dot (HIGH against DEFAULT
    in the lowered text), inductor's cache key holds torch's fp32 matmul precision, and XLA_FLAGS change what XLA
    compiles."""
    first: dict[str, str] = {}
    names = {}
    for rung, config in zip(rungs, configs, strict=True):
        key = _program_key(config)
        names[rung.name] = rung.name if rung.ablation is None else first.get(key, rung.name)
        first.setdefault(key, rung.name)
    return names


def ordered(jobs: list[PlannedRun], seed: int, filled: frozenset[str] = frozenset()) -> list[PlannedRun]:
    """The jobs repeat by repeat, each repeat in a random order drawn from ``seed`` and the repeat's number (so a
    machine that slows down over the job favours no configuration, and a rerun plans the same order), each row
    recording its place (``order``) and the seed. A compile cache is emptied before the first job that uses it, a
    cold compile, unless it was ``filled`` already; later jobs read it (their ``cache`` field says whose)."""
    out: list[PlannedRun] = []
    first_user: dict[str, str] = {}
    for repeat in sorted({int(job.fields["repeat"]) for job in jobs}):
        batch = [job for job in jobs if job.fields["repeat"] == repeat]
        random.Random(f"{seed}:{repeat}").shuffle(batch)
        for place, job in enumerate(batch):
            fields = {**job.fields, "order": place, "order_seed": seed}
            cold = False
            if job.cache is not None:
                cold = job.cache not in first_user and job.cache not in filled
                fields["cache"] = "cold" if cold else f"warm: {first_user.get(job.cache, 'an earlier run')}'s cache"
                first_user.setdefault(job.cache, job.key)
            out.append(replace(job, cold=cold, fields=fields))
    return out


def repeat_base(prepared: Prepared, repeat: int, options: LadderOptions) -> RunConfig:
    """The base config of one repeat: the preset's, or, measuring accuracy, whole epochs with evaluations on the
    whole eval split, and the repeat's own seed with its paired initial weights."""
    if options.to_accuracy is None and options.epochs is None:
        return prepared.base
    base = prepared.base.replace(steps=None, epochs=options.epochs or DEFAULT_ACCURACY_EPOCHS, eval_batches=None,
                                 target_accuracy=options.to_accuracy, seed=prepared.base.seed + repeat)
    if repeat == 0:
        return base
    return paired_config(base.replace(init_weights=None), prepared.out.parent / SHARED_WEIGHTS)


def sweep_plan(sweep: Sweep, values: list[str], base: RunConfig, frameworks: tuple[str, ...],
               repeats: int, preset: str, compile_option: str = "native", order_seed: int = 0,
               control: bool = True) -> list[PlannedRun]:
    """Every value and the A/A control (the sweep's reference value once more; ``control``: False leaves it out) x
    framework x repeat, each repeat in its own seeded random order; a value with no meaning in a framework is left
    out for it."""
    jobs = [job for repeat in range(repeats)
            for job in sweep_repeat(sweep, values, base, frameworks, repeat, f"{repeat + 1}/{repeats}", preset,
                                    compile_option, control=control)]
    return ordered(jobs, order_seed)


def sweep_repeat(sweep: Sweep, values: list[str], base: RunConfig, frameworks: tuple[str, ...], repeat: int,
                 counted: str, preset: str, compile_option: str = "native",
                 only: set[Configuration] | None = None, control: bool = True) -> list[PlannedRun]:
    """One repeat of a sweep in plan order; ``only``: just these configurations (an adaptive repeat); ``control``:
    False leaves the A/A duplicate out."""
    plan = []
    for framework in frameworks:
        runnable = [(i, v, c) for i, v in enumerate(values)
                    if (c := sweep.overrides(v, base, framework)) is not None]
        if not runnable:
            continue
        reference = reference_value(sweep, [v for _, v, _ in runnable], base)
        jobs = [(i, v, c, None) for i, v, c in runnable]
        jobs += [(i, v, c, AA) for i, v, c in runnable if v == reference and control]
        for index, value, changes, duplicate in jobs:
            group = value + (AA_SUFFIX if duplicate else "")
            if only is not None and (group, framework) not in only:
                continue
            config = base.replace(**{"compile": mode_for(compile_option, framework), **changes})
            title = f"{sweep.name}={value}" + (" (A/A)" if duplicate else "")
            plan.append(PlannedRun(
                key=f"sweep/{sweep.name}/{group}/{framework}/r{repeat}", framework=framework, config=config,
                label=f"{title} {framework:<5} repeat {counted}", command="sweep",
                fields={"technique": sweep.name, "knob": sweep.knob, "value": value, "value_index": index,
                        "reference": reference, "repeat": repeat, "preset": preset, "mode": compile_option,
                        **({"control": duplicate} if duplicate else {}),
                        **(sweep.row_fields(config) if sweep.row_fields else {})}))
    return plan


def run_job(job: PlannedRun, timeout_s: float | None, store: ResultStore | None = None,
            previous: str | None = None) -> RunRecord:
    """One planned job, run in its own process (or recorded as skipped), as the row to store. ``previous``: the
    status of the key's stored row (None: no row), which decides what becomes of scalars already in its folder."""
    started = time.time()
    if job.skip_reason:
        result = RunResult(framework=job.framework, status="skipped", error=job.skip_reason)
    else:
        if job.cache and job.cold:
            shutil.rmtree(job.cache, ignore_errors=True)  # a compile cache, not a result: emptied for a cold start
        if job.config.tensorboard_dir:
            clear_scalars(Path(job.config.tensorboard_dir) / job.framework, store, previous)
        result = run_framework(job.framework, job.config, timeout_s, cache_dir=job.cache)
    return RunRecord(key=job.key, command=job.command, result=result, config=job.config.to_dict(), host=host_info(),
                     wall_s=time.time() - started, fields=dict(job.fields))


def clear_scalars(folder: Path, store: ResultStore | None, previous: str | None) -> None:
    """Makes room for a run's TensorBoard scalars. Only a failed attempt's own scalars (its row says it failed) are
    replaced by the retry's; scalars without such a row (an interrupted attempt, or a row moved aside) are moved to
    the store's ``old/<time>/``: a result is never deleted."""
    if not folder.exists():
        return
    if previous is not None and previous not in FINISHED:
        shutil.rmtree(folder, ignore_errors=True)
    elif store is not None:
        store.keep_aside(folder)


@dataclass(frozen=True)
class Adaptive:
    """The adaptive step after the requested repeats (``--precision``, ``--time-budget``): repeats of only the
    configurations whose comparisons are still undecided, each in a seeded random order, until every comparison is
    decided or known within ``precision``, the time budget would be overrun, or ``max_repeats`` is reached.
    ``undecided`` (the report's judgement, given by the command) names the configurations that need more runs;
    ``repeat`` makes one extra repeat's jobs for them."""

    undecided: Callable[[list[RunRecord]], set[Configuration]]
    repeat: Callable[[int, set[Configuration]], list[PlannedRun]]
    precision: float | None = None  # the interval half-width (0.05: +-5%) at which an undecided comparison is settled
    budget_s: float | None = None  # seconds the whole command may take, counted from ``started``
    started: float = field(default_factory=time.monotonic)
    first_repeat: int = 1  # the number of the first extra repeat (the requested repeats come before it)
    max_repeats: int = 12  # repeats in all, requested ones included
    order_seed: int = 0


@dataclass(frozen=True)
class Outcome:
    """How a plan ended: the keys of its jobs that did not finish (failed or timed out), each with its error, and
    what the adaptive step did (None: there was none)."""

    planned: int
    failed: dict[str, str]
    adaptive: dict[str, Any] | None = None
    deferred: tuple[str, ...] = ()  # planned runs the time budget left out (a rerun of the command adds them)

    @property
    def complete(self) -> bool:
        return not self.failed


def execute(plan: list[PlannedRun], store: ResultStore, title: str, timeout_s: float | None, console: Console,
            fresh: bool = False, adaptive: Adaptive | None = None) -> Outcome:
    """Runs the jobs whose keys have not finished with these settings, storing each row as it ends; then the
    adaptive step, if asked for; then the device's matmul rate, once per results folder (the report reads it, never
    measures it). ``fresh``: the folder's earlier results are moved aside first (the caller has validated everything
    by now). The progress bar's last line names the job (``title``)."""
    for job in {(job.framework, json.dumps(job.config.to_dict(), sort_keys=True)): job for job in plan
                if not job.skip_reason}.values():
        check_runnable(job.config, (job.framework,))  # every run's impossible combination, before the first
    host = host_info()
    moved = store.start({job.key: run_settings(job.config.to_dict(), host) for job in plan}, fresh,
                        other="another --name or --results")
    if moved:
        console.print(f"earlier results moved to {moved}")
    statuses = {row["key"]: row.get("status") for row in store.rows()}
    finished = {key for key, status in statuses.items() if status in FINISHED}
    ran, deferred = list(plan), []
    summary = None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(title, total=len(plan))
        for job in plan:
            if job.key not in finished:
                if _over_budget(adaptive, job, store, {j.command for j in plan}):
                    deferred.append(job.key)
                else:
                    progress.update(task, description=job.label)
                    _run_and_store(job, store, timeout_s, progress, statuses.get(job.key))
            progress.advance(task)
        if deferred:  # the budget is spent: no adaptive repeats either
            summary = _summary(adaptive, {}, f"the time budget ({adaptive.budget_s:g} s) ran out before the "  # type: ignore[union-attr]
                               f"requested repeats ended", set(), deferred)
        elif adaptive is not None:
            extra, summary = _adaptive(adaptive, plan, store, timeout_s, progress, task)
            ran += extra
        progress.update(task, description=f"{title}: device matmul rate")
        ensure_matmul_rate(store, timeout_s)
        progress.update(task, description=title)
    if summary is not None:
        store.add({"key": ADAPTIVE_KEY, "command": ADAPTIVE_COMMAND, "status": "ok", **summary})
    store.export()  # even when nothing ran: an export changed by hand is kept aside and written anew
    rows = {row["key"]: row for row in store.rows()}
    failed = {job.key: str(rows.get(job.key, {}).get("error") or "no row") for job in ran
              if job.key not in deferred and rows.get(job.key, {}).get("status") not in ("ok", "diverged", "skipped")}
    return Outcome(len(ran), failed, summary, tuple(deferred))


def _run_and_store(job: PlannedRun, store: ResultStore, timeout_s: float | None, progress: Progress,
                   previous: str | None = None) -> RunRecord:
    record = run_job(job, timeout_s, store, previous)
    store.add(record.to_row())
    if record.status not in ("ok", "skipped"):
        progress.console.print(f"[red]{job.key} {record.status}[/]: {str(record.result.error or '')[:300]}")
    return record


def _adaptive(adaptive: Adaptive, plan: list[PlannedRun], store: ResultStore, timeout_s: float | None,
              progress: Progress, task: Any) -> tuple[list[PlannedRun], dict[str, Any]]:
    """The extra repeats (see ``Adaptive``); returns their jobs and what happened, for the plan's adaptive row."""
    commands = {job.command for job in plan}
    filled = frozenset(job.cache for job in plan if job.cache)
    added: dict[str, int] = {}
    ran: list[PlannedRun] = []
    stopped, repeat = "every comparison decided or within the precision", adaptive.first_repeat
    while True:
        records = [r for r in store.records() if r.command in commands]
        need = adaptive.undecided(records)
        if not need:
            break
        if repeat >= adaptive.max_repeats:
            stopped = f"the most repeats ({adaptive.max_repeats}) reached"
            break
        jobs = ordered(adaptive.repeat(repeat, need), adaptive.order_seed, filled)
        statuses = {row["key"]: row.get("status") for row in store.rows()}
        jobs = [job for job in jobs if statuses.get(job.key) not in FINISHED]
        progress.update(task, total=next(t.total for t in progress.tasks if t.id == task) + len(jobs))
        for job in jobs:
            if adaptive.budget_s is not None:
                left = adaptive.budget_s - (time.monotonic() - adaptive.started)
                if _expected_s(job, records) > left:
                    stopped = f"the time budget ({adaptive.budget_s:g} s) ran out"
                    return ran, _summary(adaptive, added, stopped, need)
            progress.update(task, description=f"{job.label} (adaptive)")
            _run_and_store(job, store, timeout_s, progress, statuses.get(job.key))
            ran.append(job)
            name = f"{configuration_of(job.fields)} {job.framework}"
            added[name] = added.get(name, 0) + 1
            progress.advance(task)
        repeat += 1
    return ran, _summary(adaptive, added, stopped, set())


def _summary(adaptive: Adaptive, added: dict[str, int], stopped: str, left: set[Configuration],
             deferred: list[str] | None = None) -> dict[str, Any]:
    return {"precision": adaptive.precision, "budget_s": adaptive.budget_s, "added": added, "stopped": stopped,
            "still_needed": sorted(f"{group} {framework}" for group, framework in left),
            "deferred": list(deferred or [])}


def _over_budget(adaptive: Adaptive | None, job: PlannedRun, store: ResultStore, commands: set[str]) -> bool:
    """Whether a requested run after the first repeat would overrun the time budget (``--time-budget`` bounds the
    whole command: on a slow machine the later repeats stop, every configuration keeping its first repeat's run,
    and a rerun of the command adds what was left out)."""
    if adaptive is None or adaptive.budget_s is None or int(job.fields.get("repeat", 0)) < 1:
        return False
    left = adaptive.budget_s - (time.monotonic() - adaptive.started)
    return _expected_s(job, [r for r in store.records() if r.command in commands]) > left


def _expected_s(job: PlannedRun, records: list[RunRecord]) -> float:
    """How long ``job`` will take: the median wall time of its configuration's earlier runs (of any run, for a
    configuration not run yet)."""
    prefix = job.key.rsplit("/", 1)[0] + "/"
    own = sorted(r.wall_s for r in records if r.key.startswith(prefix) and r.wall_s == r.wall_s)
    every = sorted(r.wall_s for r in records if r.wall_s == r.wall_s)
    chosen = own or every
    return chosen[len(chosen) // 2] if chosen else 0.0


def outcome_line(outcome: Outcome) -> str:
    """The last line of a ladder or sweep: whether everything asked for ran (the exit code says the same)."""
    if outcome.complete and outcome.deferred:
        return (f"{outcome.planned - len(outcome.deferred)} of {outcome.planned} planned runs finished; the time "
                f"budget left {len(outcome.deferred)} of the later repeats out (rerun the same command to add them)")
    if outcome.complete:
        return f"all {outcome.planned} planned runs finished (ok, diverged or skipped with a reason)"
    keys = ", ".join(list(outcome.failed)[:5]) + (" ..." if len(outcome.failed) > 5 else "")
    return (f"{len(outcome.failed)} of {outcome.planned} planned runs failed ({keys}); rerun the same command to "
            f"retry them (finished runs are kept)")
