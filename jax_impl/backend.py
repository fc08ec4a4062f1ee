"""The JAX side of the one training loop (common/loop.py): torch_impl/backend.py has the same class shape,
method for method. The step itself is jax_impl/train.py's."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from common.config import RunConfig
from common.loop import Place
from common.loop import fit as run_loop
from common.results import Compilation, Evaluation, Memory, RunResult
from common.weights import flax_to_torch, save_torch_keyed
from common.workloads import loader_options
from jax_impl import checkpoint as ckpt
from jax_impl import parallel, pipeline
from jax_impl.checkpoint import TrainState
from jax_impl.compilation import compile_count, compile_seconds, measure_xla_memory
from jax_impl.data import make_loader
from jax_impl.mesh import pipeline_mesh, place
from jax_impl.profiling import StepProfiler
from jax_impl.techniques import apply_flags
from jax_impl.train import (
    evaluate,
    kernel_notes,
    loss_fn,
    make_model,
    make_optimizer,
    make_train_step,
    measure_saved_bytes,
)

Batch = tuple[jax.Array, jax.Array]


class Backend:
    """JAX: one process over its devices, or several joined by jax.distributed; arrays span the processes, so
    every process runs evaluation and checkpoints (SPMD), and process 0 speaks for the run."""

    name = "jax"
    version = jax.__version__

    def start(self, config: RunConfig) -> Place:
        self.config = config
        if config.xla_flags:  # read once, when XLA's backend starts: before any device is touched
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {config.xla_flags}".strip()
        # joins jax.distributed first when the run spans processes; None on one device
        self.data_parallel = parallel.start(config)
        self.scope = contextlib.ExitStack()
        self.scope.enter_context(jax.enable_x64(config.precision == "fp64"))  # left in finish()
        notes = apply_flags(config)
        return Place(rank=jax.process_index(), replicas=config.devices, processes=config.processes,
                     readers=config.processes, spmd=True, notes=notes)

    @property
    def device(self) -> str:
        return str(jax.devices()[0])

    def loaders(self, train_source: Any, eval_source: Any) -> tuple[Any, Any]:
        # Each process reads its slice of the global batch (batch_size per replica, as in DDP): the whole of it
        # when there is one process, and lays it out over its devices.
        config = self.config
        local = config.replace(batch_size=config.batch_size * config.devices // config.processes)
        options = loader_options(local, train=True, rank=jax.process_index(), world_size=config.processes)
        return (make_loader(train_source, options, train=True),
                make_loader(eval_source, loader_options(config, train=False), train=False))

    def build(self, arch: Any, total_steps: int) -> tuple[int, list[str]]:
        config = self.config
        model = make_model(config, arch)
        self.module = model[0]
        optimizer = make_optimizer(config, model, total_steps)
        state = optimizer.state
        notes = kernel_notes(config, arch)
        if config.pipeline_stages > 1:
            self.step_fn = pipeline.make_train_step(config, model, optimizer,
                                                    lambda logits, labels: loss_fn(config, logits, labels))
            notes += pipeline.notes(config)
        else:
            self.step_fn = make_train_step(config, model, optimizer)
        if self.data_parallel is not None:
            self.step_fn = self.data_parallel.parallelize(self.step_fn)
            notes += self.data_parallel.notes()
        start = 0
        if config.resume and (path := ckpt.latest(config.checkpoint_dir)):  # type: ignore[arg-type]
            state, start = TrainState(*ckpt.load(path, state)), ckpt.step_of(path)
        if self.data_parallel is not None:
            state = self.data_parallel.place_state(state)
        if config.pipeline_stages > 1:
            state = place(pipeline_mesh(config), state)
        self.state = self.whole = state
        self.compile_s_before, self.step_compiles = compile_seconds(), 0
        return start, notes

    def to_device(self, group: Sequence[Batch]) -> Sequence[Batch]:
        return jax.block_until_ready(group)

    def step(self, group: Sequence[Batch], inject_inf: bool) -> float:
        inject = jnp.asarray(inject_inf)
        losses = []
        compiled_before = compile_count()
        for images, labels in group:  # with k > 1, optax.MultiSteps updates on the k-th micro-batch (torch's too)
            if self.data_parallel is not None:
                images, labels = self.data_parallel.place_batch(images, labels)
            self.state, loss = self.step_fn(self.state, images, labels, inject)
            if self.data_parallel is not None:
                loss = self.data_parallel.loss_value(loss)
            losses.append(loss)
        self.step_compiles += compile_count() - compiled_before  # programs built by the step calls (pmap's count)
        # summed on the host: a device add of a Python float would compile a program of its own
        return float(np.sum(jax.device_get(jax.block_until_ready(losses)), dtype=np.float64)) / len(group)

    def loss_scale(self) -> float:
        return float(np.asarray(self.state.loss_scale.scale).reshape(-1)[0])  # pmap: one per replica, all equal

    def save(self, folder: str, step: int) -> None:
        # Orbax writes a replicated global array once, from process 0, when every process calls save.
        one_process = self.data_parallel is not None and self.config.processes == 1
        ckpt.save(folder, step, self.data_parallel.gather_state(self.state) if one_process else self.state)

    def gather(self) -> None:
        self.whole = self.state if self.data_parallel is None else self.data_parallel.gather_state(self.state)

    def evaluate(self, loader: Any, step: int) -> Evaluation:
        return Evaluation(step=step, **evaluate(self.config, self._model(), loader))

    def memory(self, first: Sequence[Batch]) -> Memory:
        values: dict[str, Any] = {}
        # one replica's micro-batch, as torch's DDP replica measures its own (the first group is the global batch)
        images, labels = (x[: self.config.batch_size] for x in first[0])
        values["saved_for_backward_bytes"] = measure_saved_bytes(self.config, self._model(), images, labels)
        if self.data_parallel is None:  # XLA's analysis of the single-device step's program
            if self.config.compile == "compiled" and self.config.compile_scope == "step":  # else no whole-step program
                values.update(measure_xla_memory(self.step_fn, self.whole, *first[0]))
        stats = jax.local_devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            values["peak_allocated_bytes"] = int(stats["peak_bytes_in_use"])
        return Memory(**values)

    def _model(self) -> tuple[Any, dict[str, Any]]:
        """The model as jax_impl/train.py takes it: the module and the whole state's variables."""
        return self.module, {"params": self.whole.params, "batch_stats": self.whole.batch_stats}

    def profiler(self, folder: str) -> StepProfiler:
        return StepProfiler(folder)

    def save_weights(self, path: str) -> None:
        save_torch_keyed(path, flax_to_torch({"params": self.whole.params, "batch_stats": self.whole.batch_stats}))

    def compilation(self) -> Compilation:
        # jit's count of compiled shapes; pmap has no jit cache: the programs its calls compiled
        cache_size = getattr(self.step_fn, "_cache_size", None)
        return Compilation(graphs=cache_size() if cache_size else self.step_compiles,
                           seconds=compile_seconds() - self.compile_s_before)

    def finish(self, clean: bool) -> None:
        self.scope.close()


def fit(config: RunConfig) -> RunResult:
    """Trains per ``config`` in this process (one of several under jax.distributed): the loop with JAX's backend."""
    return run_loop(config, Backend())
