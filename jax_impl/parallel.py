"""Data parallel on the JAX side, three ways over one process's devices; torch_impl/parallel.py mirrors it
with DDP. ``sharding`` is what current JAX recommends first: the ordinary jitted step on a batch laid out
with a NamedSharding over a Mesh (XLA inserts the all-reduces; BatchNorm then sees the global batch, i.e.
SyncBatchNorm). ``shard_map`` writes the per-replica program with explicit collectives (pmean of the
gradients; BatchNorm per replica unless ``sync_bn``). ``pmap`` is kept because the project's design names
it, but since JAX 0.8 it is built on jit + shard_map and in maintenance mode.

Per-replica BatchNorm keeps replica 0's running statistics, as DDP does by broadcasting rank 0's buffers.

Beyond one process (``processes`` > 1), jax.distributed joins the processes (one per machine, or several on
one): the mesh spans every process's devices, each process loads its own slice of the global batch (the
shared sampler's rank = process index), and the slices become one global array through
make_array_from_process_local_data. Process 0 speaks for the run, as rank 0 does under torchrun."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.config import RunConfig
from common.errors import ConfigError
from jax_impl.mesh import AXIS

# The process's place when a launcher of ours starts it (experiments/execution/runner.py, or by hand on several
# machines, with JAX_COORDINATOR_ADDRESS, which JAX itself reads); unset, JAX detects SLURM, Open MPI or Kubernetes.
PROCESS_ID_VARIABLE = "TWINRUN_PROCESS_ID"


def start(config: RunConfig) -> DataParallel | None:
    """Joins the jax.distributed run when the config spans several processes (before any device use); the run's
    DataParallel, None on one device."""
    if config.processes > 1 and not jax.distributed.is_initialized():
        _join(config)
    return DataParallel.create(config)


def _join(config: RunConfig) -> None:
    process_id = os.environ.get(PROCESS_ID_VARIABLE)
    try:
        jax.distributed.initialize(num_processes=config.processes,
                                   process_id=None if process_id is None else int(process_id))
    except (ValueError, RuntimeError) as exc:  # no coordinator address, or JAX already started: name it
        raise ConfigError(f"processes={config.processes}: jax.distributed could not start ({exc}); set "
                          f"JAX_COORDINATOR_ADDRESS=host:port and {PROCESS_ID_VARIABLE}, or run under SLURM / Open "
                          f"MPI, or let `twinrun run` launch the processes") from exc
    if jax.process_count() != config.processes:
        raise ConfigError(f"processes={config.processes} but jax.distributed joined {jax.process_count()}")


@dataclass
class DataParallel:
    """The run's replicas over this process's devices (and the other processes', under jax.distributed)."""

    config: RunConfig
    devices: list[Any]
    mesh: Mesh

    @classmethod
    def create(cls, config: RunConfig) -> DataParallel | None:
        """The replicas' mesh, None on one device."""
        if config.devices == 1:
            return None
        per_process = config.devices // config.processes
        local = jax.local_devices()
        if len(local) < per_process:
            raise ConfigError(f"devices={config.devices} over {config.processes} process(es) needs {per_process} per "
                              f"process but JAX sees {len(local)} here ({local[0].platform}); on a CPU host set "
                              f"XLA_FLAGS=--xla_force_host_platform_device_count={per_process} before JAX starts "
                              f"(the driver does)")
        if config.compile != "compiled":
            raise ConfigError("JAX data parallel needs compile=compiled: sharded programs are jitted")
        # Process-major order: device i holds the i-th slice of the global batch, which lies in its process's slice.
        devices = [d for p in range(jax.process_count())
                   for d in sorted((d for d in jax.devices() if d.process_index == p),
                                   key=lambda d: d.id)[:per_process]]
        return cls(config, devices, Mesh(np.array(devices), (AXIS,)))

    def notes(self) -> list[str]:
        if self.config.jax_parallel == "sharding" and self.config.norm == "batch" and not self.config.sync_bn:
            return ["jit + sharding: BatchNorm statistics are over the global batch (as SyncBatchNorm); per-replica "
                    "statistics, as DDP has, need jax_parallel shard_map or pmap"]
        if self.config.jax_parallel == "pmap":
            return ["pmap: in maintenance mode since JAX 0.8 (built on jit + shard_map); sharding is the modern path"]
        return []

    def parallelize(self, computation: Callable) -> Callable:
        """The single-device step made data parallel (state, images, labels, inject) -> (state, loss). The step is what
        JAX makes data parallel; torch's twin takes the model, which its step is built on."""
        step = computation
        mode = self.config.jax_parallel
        if mode == "sharding":
            return jax.jit(step, donate_argnums=(0,))
        if mode == "shard_map":
            mapped = jax.shard_map(step, mesh=self.mesh, in_specs=(P(), P(AXIS), P(AXIS), P()), out_specs=(P(), P()))
            return jax.jit(mapped, donate_argnums=(0,))
        return jax.pmap(step, axis_name=AXIS, in_axes=(0, 0, 0, None), donate_argnums=(0,), devices=self.devices)

    def place_state(self, state: Any) -> Any:
        if self.config.jax_parallel == "pmap":  # one copy per device along a leading axis
            n = len(self.devices)
            stacked = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, *np.shape(x))), state)
            return jax.device_put(stacked, NamedSharding(self.mesh, P(AXIS)))
        replicated = NamedSharding(self.mesh, P())
        if self.config.processes > 1:  # every process holds the same values; each fills its own devices
            def fill(x: Any) -> jax.Array:
                host = np.asarray(x)
                return jax.make_array_from_callback(np.shape(x), replicated, lambda index: host[index])

            return jax.tree.map(fill, state)
        return jax.device_put(state, replicated)

    def place_batch(self, images: Any, labels: Any) -> tuple[Any, Any]:
        if self.config.jax_parallel == "pmap":
            n = len(self.devices)
            images, labels = (np.asarray(a).reshape(n, a.shape[0] // n, *a.shape[1:]) for a in (images, labels))
        sharding = NamedSharding(self.mesh, P(AXIS))
        if self.config.processes > 1:  # this process's slice of the global batch
            return (jax.make_array_from_process_local_data(sharding, np.asarray(images)),
                    jax.make_array_from_process_local_data(sharding, np.asarray(labels)))
        return jax.device_put(images, sharding), jax.device_put(labels, sharding)

    def loss_value(self, loss: jax.Array) -> jax.Array:
        if self.config.jax_parallel == "pmap":
            return loss[0]
        return loss.addressable_data(0) if self.config.processes > 1 else loss  # a local copy of the replicated value

    def gather_state(self, state: Any) -> Any:
        """One copy of the (replicated) state, for evaluation and checkpoints: this process's own."""
        if self.config.jax_parallel == "pmap":
            return jax.tree.map(lambda x: x[0], state)
        if self.config.processes > 1:
            return jax.tree.map(lambda x: x.addressable_data(0), state)
        return state
