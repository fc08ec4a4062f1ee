"""Data parallel on the torch side: DistributedDataParallel in processes started by torchrun (gloo on
CPU, nccl on GPU). jax_impl/parallel.py mirrors it with pmap, jit + NamedSharding and shard_map.

A process learns its place from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); with none, it is
the only process and nothing here changes the run."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.config import RunConfig
from common.errors import ConfigError


@dataclass(frozen=True)
class Replica:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1



def from_environment() -> Replica:
    return Replica(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))


def start(config: RunConfig) -> Replica:
    """Joins the process group torchrun set up; checks that it has the size the config asks for."""
    replica = from_environment()
    wanted = config.devices * config.pipeline_stages  # a process per data-parallel replica, or per pipeline stage
    if replica.world_size != wanted:
        raise ConfigError(f"devices={config.devices}, pipeline_stages={config.pipeline_stages} needs {wanted} "
                          f"processes "
                          f"(torchrun --nproc-per-node {wanted}); this one sees WORLD_SIZE={replica.world_size}")
    if replica.distributed and not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(replica.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    return replica


def device_for(replica: Replica) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", replica.local_rank)
    return torch.device("cpu")


def wrap(model: torch.nn.Module, config: RunConfig, replica: Replica, device: torch.device) -> torch.nn.Module:
    """DDP around the model (SyncBatchNorm first, if asked); the model itself where there is one process."""
    if config.sync_bn and device.type != "cuda":
        raise ConfigError("sync_bn: torch's SyncBatchNorm runs on GPUs only (it raises on CPU tensors); "
                          "on CPU, JAX's axis_name BatchNorm is the cross-replica variant")
    if not replica.distributed or config.pipeline_stages > 1:  # pipeline stages are not replicas
        return model
    if config.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return torch.nn.parallel.DistributedDataParallel(model,
                                                     device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(model: torch.nn.Module, last_micro_batch: bool) -> contextlib.AbstractContextManager:
    """Accumulation: gradients are all-reduced once per optimizer step, on the last micro-batch only."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return model.no_sync()
    return contextlib.nullcontext()


def mean_across_replicas(value: torch.Tensor, replica: Replica) -> torch.Tensor:
    """The global batch's loss from each replica's (equal-sized) share."""
    if not replica.distributed:
        return value
    total = value.detach().clone()
    dist.all_reduce(total)
    return total / replica.world_size


def finish(replica: Replica) -> None:
    if replica.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
