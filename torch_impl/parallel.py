"""Data parallel on the torch side: DistributedDataParallel in processes started by torchrun (gloo on
CPU, nccl on GPU). jax_impl/parallel.py mirrors it with pmap, jit + NamedSharding and shard_map: the same
``start`` and a ``DataParallel`` with the same methods, which are no-ops here where torch needs nothing (each
process already holds its replica's state and batch slice).

A process learns its place from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); with none, it is
the only process and nothing here changes the run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from common.config import RunConfig
from common.errors import ConfigError
from torch_impl.data import current_device


def start(config: RunConfig) -> DataParallel | None:
    """Joins the process group torchrun set up (a process per data-parallel replica, or per pipeline stage) and
    checks that it has the size the config asks for; the run's DataParallel, None with one replica."""
    rank, world_size, local_rank = _from_environment()
    wanted = config.devices * config.pipeline_stages
    if world_size != wanted:
        raise ConfigError(f"devices={config.devices}, pipeline_stages={config.pipeline_stages} needs {wanted} "
                          f"processes "
                          f"(torchrun --nproc-per-node {wanted}); this one sees WORLD_SIZE={world_size}")
    if world_size > 1 and not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    if config.sync_bn and current_device().type != "cuda":
        raise ConfigError("sync_bn: torch's SyncBatchNorm runs on GPUs only (it raises on CPU tensors); "
                          "on CPU, JAX's axis_name BatchNorm is the cross-replica variant")
    return DataParallel.create(config)


def _from_environment() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


@dataclass(frozen=True)
class DataParallel:
    """This process's replica among ``world_size`` (torchrun's ranks)."""

    config: RunConfig
    rank: int = 0
    world_size: int = 1

    @classmethod
    def create(cls, config: RunConfig) -> DataParallel | None:
        """The replica this process is, None with one replica (pipeline stages are processes, not replicas)."""
        if config.devices == 1:
            return None
        rank, world_size, _ = _from_environment()
        return cls(config, rank, world_size)

    def notes(self) -> list[str]:
        return []

    def parallelize(self, computation: torch.nn.Module) -> torch.nn.Module:
        """DDP around the model (SyncBatchNorm first, if asked): its gradients all-reduced in backward. The model is
        what torch makes data parallel (the step is built on it); JAX's twin takes the step itself."""
        model = computation
        if self.config.sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device = next(model.parameters()).device
        return torch.nn.parallel.DistributedDataParallel(model,
                                                         device_ids=[device.index] if device.type == "cuda" else None)

    def place_state(self, state: Any) -> Any:
        """Each process holds its replica's state already (DDP broadcasts rank 0's parameters when it wraps)."""
        return state

    def place_batch(self, images: Any, labels: Any) -> tuple[Any, Any]:
        """Each process loaded its own slice of the global batch."""
        return images, labels

    def loss_value(self, loss: torch.Tensor) -> torch.Tensor:
        """The global batch's loss from each replica's (equal-sized) share."""
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def gather_state(self, state: Any) -> Any:
        """The replicas hold equal weights: this process's own."""
        return state
