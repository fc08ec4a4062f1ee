"""The torch side of the one training loop (common/loop.py): jax_impl/backend.py has the same class shape,
method for method. The step itself is torch_impl/train.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from common.config import RunConfig
from common.loop import Place
from common.loop import fit as run_loop
from common.results import Compilation, Evaluation, Memory, RunResult
from common.weights import save_torch_keyed
from common.workloads import loader_options
from torch_impl import checkpoint as ckpt
from torch_impl import parallel, pipeline
from torch_impl.compilation import (
    backend_notes,
    compile_count,
    compile_seconds,
    recompile_limit_hits,
    recompile_limit_notes,
)
from torch_impl.data import current_device, make_loader, synchronize, to_device
from torch_impl.profiling import StepProfiler
from torch_impl.techniques import apply_flags
from torch_impl.train import (
    evaluate,
    kernel_notes,
    loss_fn,
    make_model,
    make_optimizer,
    make_train_step,
    measure_saved_bytes,
)

Batch = tuple[torch.Tensor, torch.Tensor]


class Backend:
    """torch: one process, or one process per DDP replica / pipeline stage under torchrun; rank 0 evaluates,
    checkpoints and speaks for the run."""

    name = "torch"
    version = torch.__version__

    def start(self, config: RunConfig) -> Place:
        self.config = config
        self.data_parallel = parallel.start(config)  # None with one replica
        self.device_ = current_device()  # the replica's own, which start set
        notes = apply_flags(config)
        # Data-parallel replicas read their slices of the global batch; pipeline stages all read the whole batch
        # (the first stage uses the images, the last the labels).
        rank = dist.get_rank() if dist.is_initialized() else 0
        processes = dist.get_world_size() if dist.is_initialized() else 1
        self.data_rank, self.data_world = (rank, processes) if self.data_parallel is not None else (0, 1)
        return Place(rank=rank, replicas=self.data_world, processes=processes, readers=self.data_world, spmd=False,
                     notes=notes)

    @property
    def device(self) -> str:
        return str(self.device_)

    def loaders(self, train_source: Any, eval_source: Any) -> tuple[Any, Any]:
        options = loader_options(self.config, train=True, rank=self.data_rank, world_size=self.data_world)
        return (make_loader(train_source, options, train=True),
                make_loader(eval_source, loader_options(self.config, train=False), train=False))

    def build(self, arch: Any, total_steps: int) -> tuple[int, list[str]]:
        config, device = self.config, self.device_
        self.model = make_model(config, arch)
        self.optimizer = make_optimizer(config, self.model, total_steps)
        notes = kernel_notes(config, arch) + backend_notes(config)
        if config.pipeline_stages > 1:
            self.step_fn = pipeline.make_train_step(config, self.model, self.optimizer,
                                                    lambda logits, labels: loss_fn(config, logits, labels))
            notes += pipeline.notes(config)
        else:
            parallel_model = self.model if self.data_parallel is None else self.data_parallel.parallelize(self.model)
            self.step_fn = make_train_step(config, parallel_model, self.optimizer)
        if self.data_parallel is not None:
            notes += self.data_parallel.notes()
        start = self._restore() if config.resume else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.compiles_before, self.compile_s_before = compile_count(), compile_seconds()
        self.limit_hits_before = recompile_limit_hits()
        return start, notes

    def _restore(self) -> int:
        path = ckpt.latest(self.config.checkpoint_dir)  # type: ignore[arg-type]
        if path is None:
            return 0
        state = ckpt.load(path)
        self.model.load_state_dict(state["model"])
        self.optimizer.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.scheduler.load_state_dict(state["scheduler"])
        self.optimizer.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        return int(state["step"])

    def to_device(self, group: Sequence[Batch]) -> Sequence[Batch]:
        group = [to_device(self.config, images, labels, self.device_) for images, labels in group]
        synchronize(self.device_)
        return group

    def step(self, group: Sequence[Batch], inject_inf: bool) -> float:
        total = None
        for images, labels in group:  # with k > 1, the step updates on the k-th micro-batch (jax_impl's loop too)
            if self.data_parallel is not None:
                images, labels = self.data_parallel.place_batch(images, labels)
            loss = self.step_fn(images, labels, inject_inf)
            total = loss if total is None else total + loss
        mean = total / len(group)
        if self.data_parallel is not None:
            mean = self.data_parallel.loss_value(mean)  # one all-reduce a step, of the replicas' means
        value = float(mean)  # a host read: waits for the device
        synchronize(self.device_)
        return value

    def loss_scale(self) -> float:
        scaler = self.optimizer.scaler
        return float(scaler.get_scale()) if scaler.is_enabled() else 1.0

    def save(self, folder: str, step: int) -> None:
        optimizer, scheduler, scaler = self.optimizer
        ckpt.save(folder, step, {"model": self.model.state_dict(), "optimizer": optimizer.state_dict(),
                                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                                 "rng": torch.get_rng_state()})

    def gather(self) -> None:
        """Pipelined, rank 0 receives the second stage's parameters and buffers (BatchNorm statistics), so that it
        holds the whole trained model; every rank calls it. Data-parallel replicas hold equal weights already."""
        if self.config.pipeline_stages > 1:
            with torch.no_grad():
                for tensor in pipeline.stage_modules(self.model)[1].state_dict().values():
                    dist.broadcast(tensor, src=1)

    def evaluate(self, loader: Any, step: int) -> Evaluation:
        return Evaluation(step=step, **evaluate(self.config, self.model, loader))

    def memory(self, first: Sequence[Batch]) -> Memory:
        peak = torch.cuda.max_memory_allocated(self.device_) if self.device_.type == "cuda" else None
        saved = measure_saved_bytes(self.config, self.model, *first[0])
        return Memory(peak_allocated_bytes=peak, saved_for_backward_bytes=saved)

    def profiler(self, folder: str) -> StepProfiler:
        return StepProfiler(folder, self.device_)

    def save_weights(self, path: str) -> None:
        save_torch_keyed(path, {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()
                                if v.is_floating_point()})

    def compilation(self) -> Compilation:
        return Compilation(graphs=compile_count() - self.compiles_before,
                           seconds=compile_seconds() - self.compile_s_before,
                           notes=tuple(recompile_limit_notes(recompile_limit_hits() - self.limit_hits_before)))

    def finish(self, clean: bool) -> None:
        if clean and dist.is_initialized():  # after a failure the other ranks may never reach the barrier
            dist.barrier()
            dist.destroy_process_group()


def fit(config: RunConfig) -> RunResult:
    """Trains per ``config`` in this process (or this torchrun replica): the loop with torch's backend."""
    return run_loop(config, Backend())
