"""THE training loop, for both frameworks: steps, timing, evaluation cadence, divergence, checkpoint cadence,
the profiling window and the result. Each framework supplies a ``Backend`` (torch_impl/backend.py,
jax_impl/backend.py, alike name for name); the loop treats the two the same, so a difference between their
results is a difference between the frameworks, not between two loops.

A step is one optimizer update over ``grad_accum_steps`` micro-batches, in both frameworks.

Time to accuracy (``target_accuracy``): the loop then also evaluates at every epoch end and stops at the first
evaluation that reaches the target; every evaluation carries the seconds since the process started and the
seconds of training steps before it, and every step its end since the process started, so a report can put the
frameworks side by side on wall time as well as on steps. TensorBoard scalars (``tensorboard_dir``) are written
between steps, after a step's timed part has ended.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from common.config import RunConfig
from common.data.batches import grouped
from common.errors import ConfigError
from common.metrics import is_diverged
from common.results import Compilation, Evaluation, Memory, RunResult
from common.scalars import Scalars
from common.schedule import learning_rate
from common.timing import StepTimer, process_start_perf_counter, process_start_time
from common.workloads import open_sources, workload_for

Batch = tuple[Any, Any]  # (images, labels), framework arrays


@dataclass(frozen=True)
class Place:
    """Where this process stands in the run."""

    rank: int = 0  # process index; 0 speaks for the run
    replicas: int = 1  # data-parallel replicas
    processes: int = 1
    readers: int = 1  # processes that each read a distinct slice of the global batch
    # True where the engine's arrays span processes (JAX): evaluation and checkpoints are then collective
    # programs that every process runs; otherwise (torch) rank 0 alone evaluates and writes.
    spmd: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def takes_part(self) -> bool:
        """Whether this process evaluates, measures memory and writes checkpoints."""
        return self.is_main or self.spmd


@dataclass
class Progress:
    """The run on the wall clock, for time to accuracy: readings of ``time.perf_counter`` (the clock the steps are
    timed on) become seconds since this process started, and the seconds of training steps and of evaluations
    are added up as they pass."""

    origin: float = field(default_factory=process_start_perf_counter)  # perf_counter's reading at process start
    start_time: float = field(default_factory=process_start_time)  # the same instant, Unix time
    train_s: float = 0.0  # data wait + compute of every step so far, the first one included
    evaluation_s: float = 0.0
    step_elapsed_s: list[float] = field(default_factory=list)
    evaluated_at: int | None = None  # the step of the latest evaluation, in every process (not only those that hold it)

    def elapsed(self, reading: float) -> float:
        return reading - self.origin

    def wall(self, reading: float) -> float:
        """Unix time of a perf_counter reading (TensorBoard's wall time, consistent with ``elapsed``)."""
        return self.start_time + reading - self.origin

    def stepped(self, began: float, ended: float) -> None:
        self.train_s += ended - began
        self.step_elapsed_s.append(ended - self.origin)


class Loader(Protocol):
    def __len__(self) -> int: ...

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]: ...


class Profiler(Protocol):
    def start(self) -> None: ...

    def step(self) -> None: ...

    def stop(self) -> dict[str, Any]: ...


class Backend(Protocol):
    """One framework's side of a training run, called by ``fit`` in this order: start, loaders, build, then
    to_device + step per step (with loss_scale, save, gather + evaluate at their cadence), then memory,
    save_weights, compilation and finish."""

    name: str  # "torch" | "jax"
    version: str
    device: str

    def start(self, config: RunConfig) -> Place:
        """Join the run's processes, apply the framework flags; notes on techniques with no effect here."""

    def loaders(self, train_source: Any, eval_source: Any) -> tuple[Loader, Loader]:
        """The training loader (this process's slice, augmented, shuffled) and the evaluation loader."""

    def build(self, arch: Any, total_steps: int) -> tuple[int, list[str]]:
        """Model, optimizer and step function; restores the latest checkpoint if the config resumes.
        Returns (the step to start from, notes)."""

    def to_device(self, group: Sequence[Batch]) -> Sequence[Batch]:
        """The step's micro-batches on the device, transfer finished (so the data wait ends here)."""

    def step(self, group: Sequence[Batch], inject_inf: bool) -> float:
        """One optimizer step; the mean micro-batch loss over every replica, read on the host (synchronized)."""

    def loss_scale(self) -> float:
        """The fp16 dynamic loss scale (1.0 when there is none); it falls when a step was skipped."""

    def save(self, folder: str, step: int) -> None:
        """A checkpoint of the whole training state."""

    def gather(self) -> None:
        """Every process: bring the whole model to where evaluate and save_weights read it."""

    def evaluate(self, loader: Loader, step: int) -> Evaluation:
        """Accuracy and loss over the evaluation loader (at most ``eval_batches`` batches)."""

    def memory(self, first: Sequence[Batch]) -> Memory:
        """What the framework can say about memory, measured on the first step's micro-batches."""

    def profiler(self, folder: str) -> Profiler: ...

    def save_weights(self, path: str) -> None:
        """The final weights, torch-keyed (.npz), for inference and for the other framework."""

    def compilation(self) -> Compilation:
        """Graphs compiled since build (torch.compile graphs / jit cache entries), the seconds they took, and
        notes (a recompile limit reached)."""

    def finish(self, clean: bool) -> None:
        """Leave the run's processes (``clean``: after a finished loop, so every process is there to meet)."""


def fit(config: RunConfig, backend: Backend) -> RunResult:
    """Trains per ``config`` with ``backend``; the one result of this process."""
    place = backend.start(config)
    clean = False
    try:
        # Closed however the run ends (diverged, failed): the scalars up to there are what explains it.
        with Scalars(config.tensorboard_dir if place.is_main else None, backend.name) as scalars:
            result = _train(config, backend, place, scalars)
        clean = True
        return result
    finally:
        backend.finish(clean)


def _train(config: RunConfig, backend: Backend, place: Place, scalars: Scalars) -> RunResult:
    # setup: data, model, where the run starts
    if config.target_accuracy is not None and place.processes > 1 and not place.spmd:
        raise ConfigError(f"target_accuracy over {place.processes} {backend.name} processes is not built: only rank "
                          f"0 evaluates, and the loop has no way to tell the other ranks to stop with it")
    train_source, eval_source = open_sources(config)
    arch = workload_for(config.model).describe(config, train_source.num_classes)
    train_loader, eval_loader = backend.loaders(train_source, eval_source)
    k = config.grad_accum_steps
    steps_per_epoch = len(train_loader) // k
    if steps_per_epoch == 0:
        raise ConfigError(f"an epoch of {len(train_loader)} batches holds no step of {k} micro-batches")
    total_steps = config.steps or config.epochs * steps_per_epoch  # type: ignore[operator]
    start, build_notes = backend.build(arch, total_steps)
    notes = [*place.notes, *build_notes] + ([f"resumed from step {start}"] if start else [])
    run = _Run(steps_done=start, updates=start, timer=StepTimer(config.timing_warmup), scale=backend.loss_scale())
    window = _ProfilerWindow(backend, config, total_steps)
    batches = _step_batches(train_loader, k, start, steps_per_epoch, window.open_if_due)

    # the steps, and the run's three exits: the steps are done (the loop's condition), the loss diverged, the
    # target accuracy is reached
    while run.steps_done < total_steps:
        began, group = next(batches)
        loss = _step(config, backend, place, scalars, run, window, began, group, total_steps)
        if is_diverged(loss, run.losses[0]):
            run.status = "diverged"
            break
        _after_step(config, backend, place, run.steps_done)
        if (_evaluates_after(config, run.steps_done, total_steps, steps_per_epoch)
                and _reaches(config, _evaluate(backend, place, eval_loader, run, scalars))):
            break

    # the result
    profile = window.close()
    ok = run.status == "ok"
    if ok and run.progress.evaluated_at != run.steps_done:  # not when the run stopped at an evaluation
        _evaluate(backend, place, eval_loader, run, scalars)
    if ok and config.target_accuracy is not None and place.is_main:
        notes.append(_target_note(config.target_accuracy, run.evals, total_steps))
    memory = backend.memory(run.first) if run.first is not None and ok and place.takes_part else Memory()
    if config.save_weights and ok and place.is_main:
        backend.save_weights(config.save_weights)
    compiled = backend.compilation() if config.compile == "compiled" else Compilation()
    graphs = compiled.graphs
    return RunResult(
        framework=backend.name, status=run.status, steps_done=run.steps_done, start_step=start, losses=run.losses,
        loss_scales=run.loss_scales, timing=run.timer.summary(), memory=memory, evals=run.evals,
        step_elapsed_s=run.progress.step_elapsed_s, evaluation_s=run.progress.evaluation_s,
        final_lr=float(learning_rate(run.updates, config, total_steps, np)),
        recompiles=max(graphs - run.first_graphs, 0), graphs_compiled=graphs, compile_s=compiled.seconds,
        notes=[*notes, *compiled.notes], device=backend.device,
        framework_version=backend.version,
        num_classes=arch.num_classes, synthetic_data=train_source.synthetic,
        augmentations=list(train_source.augmentations), replicas=place.replicas,
        processes=place.processes, process_index=place.rank, profile=profile)


@dataclass
class _Run:
    """What the steps so far have done, and what the result is made of."""

    steps_done: int  # counted from the step the run started (or resumed) at
    # optimizer updates: an fp16 step skipped on overflow is none, and leaves the LR where it is
    updates: int
    timer: StepTimer
    scale: float  # the fp16 loss scale after the latest step (1.0 without one)
    status: str = "ok"  # or diverged
    progress: Progress = field(default_factory=Progress)
    losses: list[float] = field(default_factory=list)
    loss_scales: list[float] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)
    first: Sequence[Batch] | None = None  # the first step's micro-batches, on the device (memory is measured on them)
    # graphs compiled by the end of the second step: the first step compiles the model's (and a compiled update's
    # optimizer's), the second the update again where the optimizer's state came into being in the first (torch's
    # momentum and Adam buffers); the graphs beyond them are recompilations, for new shapes
    first_graphs: int = 0


class _ProfilerWindow:
    """The last ``profile_steps`` steps run traced: the profiler starts before the data wait of the first of them and
    stops after the last step (before the final evaluation); traced steps are slower, so they stay out of the
    steady-state statistics."""

    def __init__(self, backend: Backend, config: RunConfig, total_steps: int) -> None:
        self.backend, self.config, self.total_steps = backend, config, total_steps
        self.profiler: Profiler | None = None

    def open_if_due(self, step: int) -> None:
        if self.config.profile_steps and self.profiler is None and step >= self.total_steps - self.config.profile_steps:
            self.profiler = self.backend.profiler(self.config.profile_dir)  # type: ignore[arg-type]
            self.profiler.start()

    @property
    def tracing(self) -> bool:
        return self.profiler is not None

    def close(self) -> dict[str, Any] | None:
        return self.profiler.stop() if self.profiler is not None else None


def _step_batches(loader: Loader, k: int, start: int, steps_per_epoch: int,
                  before_wait: Callable[[int], None]) -> Iterator[tuple[float, Sequence[Batch]]]:
    """Each step's ``k`` micro-batches from step ``start`` on, across epochs (a resumed run starts its epoch at the
    micro-batch offset of its step), with the clock's reading when the step's data wait began. Endless: the loop
    decides where the run ends, and an epoch's iterator lives until the run is over. ``before_wait(step)`` runs
    before each wait begins; making an epoch's iterator, and finding it ended, stay out of every step's wait."""
    step = start
    while True:
        epoch, offset = divmod(step, steps_per_epoch)
        groups = grouped(loader.epoch(epoch, start_batch=offset * k), k)
        while True:
            before_wait(step)
            began = time.perf_counter()
            group = next(groups, None)
            if group is None:
                break  # the epoch is over: the next one starts at this step
            yield began, group
            step += 1


def _step(config: RunConfig, backend: Backend, place: Place, scalars: Scalars, run: _Run, window: _ProfilerWindow,
          began: float, group: Sequence[Batch], total_steps: int) -> float:
    """One optimizer step, timed (data wait: from ``began`` until the micro-batches are on the device; compute: the
    step, synchronized), counted and written down; its loss."""
    clock = time.perf_counter
    group = backend.to_device(group)
    ready = clock()
    loss = backend.step(group, inject_inf=config.inject_inf_at_step == run.steps_done)
    ended = clock()
    if window.tracing:
        window.profiler.step()  # type: ignore[union-attr]
    else:
        run.timer.record(ready - began, ended - ready, sum(len(labels) for _, labels in group) * place.readers)
    run.progress.stepped(began, ended)
    run.first = group if run.first is None else run.first
    used = run.updates  # the step ran at the LR of the updates before it
    previous, run.scale = run.scale, backend.loss_scale()
    run.updates += 0 if run.scale < previous else 1  # a lowered scale means the step was skipped
    run.losses.append(loss)
    if len(run.losses) <= 2 and config.compile == "compiled":
        run.first_graphs = backend.compilation().graphs
    run.loss_scales.append(run.scale)
    run.steps_done += 1
    if scalars.enabled:
        lr = float(learning_rate(used, config, total_steps, np))
        scalars.write(run.steps_done, run.progress.wall(ended),
                      _step_scalars(config, loss, lr, ready - began, ended - began, run.scale))
    return loss


def _after_step(config: RunConfig, backend: Backend, place: Place, step: int) -> None:
    """The checkpoint cadence, then the test hook that dies like a killed process."""
    if config.checkpoint_every and step % config.checkpoint_every == 0 and place.takes_part:
        backend.save(config.checkpoint_dir, step)  # type: ignore[arg-type]
    if config.fail_after_step == step:
        os._exit(9)  # test hook: die like a killed process, no clean-up


def _evaluates_after(config: RunConfig, step: int, total_steps: int, steps_per_epoch: int) -> bool:
    """Whether the loop evaluates after ``step``: every ``eval_every`` steps, and at every epoch end when it runs to
    an accuracy. Never after the last step: the final evaluation after the loop is that one (after the profiler's
    window has closed)."""
    every = config.eval_every and step % config.eval_every == 0
    epoch_end = config.target_accuracy is not None and step % steps_per_epoch == 0
    return bool(every or epoch_end) and step < total_steps


def _reaches(config: RunConfig, found: Evaluation | None) -> bool:
    """Whether this evaluation ends the run. Every process decides alike: under SPMD (JAX) each one evaluates the
    same global arrays; torch over several processes is refused before the run starts."""
    target = config.target_accuracy
    return target is not None and found is not None and found.accuracy >= target


def _evaluate(backend: Backend, place: Place, loader: Loader, run: _Run, scalars: Scalars) -> Evaluation | None:
    """This process's evaluation after the steps done (none where it takes no part), stamped with its wall-clock
    place and kept with the run's."""
    step, progress = run.steps_done, run.progress
    began = time.perf_counter()
    backend.gather()  # every process: it may be a collective (the pipeline's stages send their weights)
    found = backend.evaluate(loader, step) if place.takes_part else None
    ended = time.perf_counter()
    progress.evaluation_s += ended - began
    progress.evaluated_at = step
    if found is None:
        return None
    stamped = replace(found, elapsed_s=progress.elapsed(ended), train_s=progress.train_s)
    scalars.write(step, progress.wall(ended), {"eval/accuracy": stamped.accuracy, "eval/loss": stamped.loss})
    scalars.flush()  # evaluations are rare: a live TensorBoard shows each at once
    run.evals.append(stamped)
    return stamped


def _step_scalars(config: RunConfig, loss: float, lr: float, data_wait_s: float, step_s: float,
                  scale: float) -> dict[str, float]:
    """One step's TensorBoard scalars (milliseconds, as people read step times); the loss scale only where fp16
    has one."""
    values = {"train/loss": loss, "train/lr": lr, "train/step_ms": step_s * 1e3,
              "train/data_wait_ms": data_wait_s * 1e3}
    if config.precision == "fp16":
        values["train/loss_scale"] = scale
    return values


def _target_note(target: float, evals: list[Evaluation], total_steps: int) -> str:
    """Whether and where the run reached its target accuracy, for the run's notes."""
    hit = next((e for e in evals if e.accuracy >= target), None)
    if hit is None:
        best = max((e.accuracy for e in evals), default=float("nan"))
        return f"target accuracy {target:g} not reached in {total_steps} steps (best {best:.4f})"
    return (f"target accuracy {target:g} reached at step {hit.step} of {total_steps}: {hit.accuracy:.4f}, "
            f"{hit.elapsed_s:.1f} s after the process started ({hit.train_s:.1f} s of steps)")
