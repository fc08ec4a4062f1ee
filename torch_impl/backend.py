"""The torch side of the one training loop (common/loop.py): jax_impl/backend.py has the same class shape,
method for method. The step itself is torch_impl/train.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from common.config import RunConfig
from common.loop import Place
from common.loop import fit as run_loop
from common.results import Compilation, Evaluation, Memory, RunResult
from common.weights import save_torch_keyed
from common.workloads import loader_options
from torch_impl import checkpoint as ckpt
from torch_impl import parallel, pipeline
from torch_impl.data import make_loader, synchronize
from torch_impl.profiling import StepProfiler
from torch_impl.techniques import (
    apply_flags,
    compile_counter,
    compile_seconds,
    make_grad_scaler,
    recompile_limit_hits,
    recompile_limit_notes,
)
from torch_impl.train import (
    evaluate,
    kernel_notes,
    loss_fn,
    make_model,
    make_optimizer,
    make_train_step,
    measure_saved_bytes,
    to_device,
)

Batch = tuple[torch.Tensor, torch.Tensor]


class Backend:
    """torch: one process, or one process per DDP replica / pipeline stage under torchrun; rank 0 evaluates,
    checkpoints and speaks for the run."""

    name = "torch"
    version = torch.__version__

    def start(self, config: RunConfig) -> Place:
        self.config = config
        self.replica = parallel.start(config)
        self.device_ = parallel.device_for(self.replica)
        notes = apply_flags(config, self.device_)
        # Data-parallel replicas read their slices of the global batch; pipeline stages all read the whole batch
        # (the first stage uses the images, the last the labels).
        pipelined = config.pipeline_stages > 1
        self.data_rank, self.data_world = (0, 1) if pipelined else (self.replica.rank, self.replica.world_size)
        return Place(rank=self.replica.rank, replicas=self.data_world, processes=self.replica.world_size,
                     readers=self.data_world, spmd=False, notes=notes)

    @property
    def device(self) -> str:
        return str(self.device_)

    def loaders(self, train_source: Any, eval_source: Any) -> tuple[Any, Any]:
        options = loader_options(self.config, train=True, rank=self.data_rank, world_size=self.data_world)
        return (make_loader(train_source, options, train=True),
                make_loader(eval_source, loader_options(self.config, train=False), train=False))

    def build(self, arch: Any, total_steps: int) -> tuple[int, list[str]]:
        config, device = self.config, self.device_
        self.model = make_model(config, arch, device)
        self.optimizer, self.scheduler = make_optimizer(config, self.model, total_steps)
        self.scaler = make_grad_scaler(config, device)
        notes = kernel_notes(config, arch, device)
        if config.pipeline_stages > 1:
            self.step_fn = pipeline.make_train_step(config, self.model, self.optimizer, self.scheduler, self.replica,
                                                    device, lambda logits, labels: loss_fn(config, logits, labels))
            notes += pipeline.notes(config)
        else:
            wrapped = parallel.wrap(self.model, config, self.replica, device)
            self.step_fn = make_train_step(config, wrapped, self.optimizer, self.scheduler, self.scaler, device)
        start = self._restore() if config.resume else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.compiles_before, self.compile_s_before = compile_counter(), compile_seconds()
        self.limit_hits_before = recompile_limit_hits()
        return start, notes

    def _restore(self) -> int:
        path = ckpt.latest(self.config.checkpoint_dir)  # type: ignore[arg-type]
        if path is None:
            return 0
        state = ckpt.load(path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        return int(state["step"])

    def to_device(self, group: Sequence[Batch]) -> Sequence[Batch]:
        group = [to_device(self.config, images, labels, self.device_) for images, labels in group]
        synchronize(self.device_)
        return group

    def step(self, group: Sequence[Batch], inject_inf: bool) -> float:
        loss = self.step_fn(list(group), inject_inf=inject_inf)
        value = float(parallel.mean_across_replicas(loss, self.replica))  # a host read: waits for the device
        synchronize(self.device_)
        return value

    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def save(self, folder: str, step: int) -> None:
        ckpt.save(folder, step, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                                 "rng": torch.get_rng_state()})

    def gather(self) -> None:
        if self.config.pipeline_stages > 1:
            pipeline.gather_to_first(self.model, self.replica)

    def evaluate(self, loader: Any, step: int) -> Evaluation:
        return Evaluation(step=step, **evaluate(self.config, self.model, loader, self.device_))

    def memory(self, first: Sequence[Batch]) -> Memory:
        peak = torch.cuda.max_memory_allocated(self.device_) if self.device_.type == "cuda" else None
        saved = measure_saved_bytes(self.config, self.model, first[0][0], self.device_)
        return Memory(peak_allocated_bytes=peak, saved_for_backward_bytes=saved)

    def profiler(self, folder: str) -> StepProfiler:
        return StepProfiler(folder, self.device_)

    def save_weights(self, path: str) -> None:
        save_torch_keyed(path, {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()
                                if v.is_floating_point()})

    def compilation(self) -> Compilation:
        return Compilation(graphs=compile_counter() - self.compiles_before,
                           seconds=compile_seconds() - self.compile_s_before,
                           notes=tuple(recompile_limit_notes(recompile_limit_hits() - self.limit_hits_before)))

    def finish(self, clean: bool) -> None:
        if clean:  # after a failure the other ranks may never reach the barrier
            parallel.finish(self.replica)


def fit(config: RunConfig) -> RunResult:
    """Trains per ``config`` in this process (or this torchrun replica): the loop with torch's backend."""
    return run_loop(config, Backend())
