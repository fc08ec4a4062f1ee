"""THE training loop, for both frameworks: steps, timing, evaluation cadence, divergence, checkpoint cadence,
the profiling window and the result. Each framework supplies a ``Backend`` (torch_impl/backend.py,
jax_impl/backend.py, alike name for name); the loop treats the two the same, so a difference between their
results is a difference between the frameworks, not between two loops.

A step is one optimizer update over ``grad_accum_steps`` micro-batches, in both frameworks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from common.config import RunConfig
from common.data.batches import grouped
from common.errors import ConfigError
from common.metrics import is_diverged
from common.results import Evaluation, Memory, RunResult
from common.schedule import learning_rate
from common.timing import StepTimer
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
    save_weights, graphs_compiled and finish."""

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

    def graphs_compiled(self) -> int:
        """Graphs compiled since build (torch.compile frames / jit cache entries)."""

    def finish(self, clean: bool) -> None:
        """Leave the run's processes (``clean``: after a finished loop, so every process is there to meet)."""


def fit(config: RunConfig, backend: Backend) -> RunResult:
    """Trains per ``config`` with ``backend``; the one result of this process."""
    place = backend.start(config)
    clean = False
    try:
        result = _train(config, backend, place)
        clean = True
        return result
    finally:
        backend.finish(clean)


def _train(config: RunConfig, backend: Backend, place: Place) -> RunResult:
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

    timer = StepTimer(config.timing_warmup)
    losses: list[float] = []
    loss_scales: list[float] = []
    evals: list[Evaluation] = []
    status, step = "ok", start
    updates = start  # optimizer updates: an fp16 step skipped on overflow is none, and leaves the LR where it is
    first: Sequence[Batch] | None = None
    profiler: Profiler | None = None
    scale = backend.loss_scale()
    clock = time.perf_counter
    while step < total_steps and status == "ok":
        epoch, offset = divmod(step, steps_per_epoch)
        batches = grouped(train_loader.epoch(epoch, start_batch=offset * k), k)
        while step < total_steps:
            if config.profile_steps and profiler is None and step >= total_steps - config.profile_steps:
                profiler = backend.profiler(config.profile_dir)  # type: ignore[arg-type]
                profiler.start()
            t0 = clock()
            group = next(batches, None)
            if group is None:
                break
            group = backend.to_device(group)
            t1 = clock()
            value = backend.step(group, inject_inf=config.inject_inf_at_step == step)
            t2 = clock()
            if profiler is None:  # traced steps are slower: kept out of the steady-state statistics
                timer.record(t1 - t0, t2 - t1, sum(len(labels) for _, labels in group) * place.readers)
            else:
                profiler.step()
            first = group if first is None else first
            previous, scale = scale, backend.loss_scale()
            updates += 0 if scale < previous else 1  # a lowered scale means the step was skipped
            losses.append(value)
            loss_scales.append(scale)
            step += 1
            if is_diverged(value, losses[0]):
                status = "diverged"
                break
            if config.checkpoint_every and step % config.checkpoint_every == 0 and place.takes_part:
                backend.save(config.checkpoint_dir, step)  # type: ignore[arg-type]
            if config.fail_after_step == step:
                os._exit(9)  # test hook: die like a killed process, no clean-up
            if config.eval_every and step % config.eval_every == 0 and step < total_steps:
                evals += _evaluate(backend, place, eval_loader, step)

    profile = profiler.stop() if profiler is not None else None
    ok = status == "ok"
    if ok:
        evals += _evaluate(backend, place, eval_loader, step)
    memory = backend.memory(first) if first is not None and ok and place.takes_part else Memory()
    if config.save_weights and ok and place.is_main:
        backend.save_weights(config.save_weights)
    graphs = backend.graphs_compiled() if config.compile == "compiled" else 0
    return RunResult(
        framework=backend.name, status=status, steps_done=step, start_step=start, losses=losses,
        loss_scales=loss_scales, timing=timer.summary(), memory=memory, evals=evals,
        final_lr=float(learning_rate(updates, config, total_steps, np)), recompiles=max(graphs - 1, 0),
        graphs_compiled=graphs, notes=notes, device=backend.device, framework_version=backend.version,
        num_classes=arch.num_classes, synthetic_data=train_source.synthetic, replicas=place.replicas,
        processes=place.processes, process_index=place.rank, profile=profile)


def _evaluate(backend: Backend, place: Place, loader: Loader, step: int) -> list[Evaluation]:
    backend.gather()  # every process: it may be a collective (the pipeline's stages send their weights)
    return [backend.evaluate(loader, step)] if place.takes_part else []
