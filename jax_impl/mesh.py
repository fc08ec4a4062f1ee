"""The device meshes of JAX's SPMD programs and what a step body does on their named axes: data parallel's "data"
axis (jax_impl/parallel.py) and the pipeline's "stage" axis (jax_impl/pipeline.py). JAX only: torch's replicas and
stages are processes (torch.distributed), which have no mesh to lay arrays out on."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.config import RunConfig
from common.errors import ConfigError

AXIS = "data"  # data parallel's replicas
STAGE_AXIS = "stage"  # the pipeline's stages


def bn_axis_name(config: RunConfig) -> str | None:
    """The BatchNorm axis: cross-replica statistics under shard_map / pmap when sync_bn is asked for."""
    if config.devices > 1 and config.sync_bn and config.jax_parallel in ("shard_map", "pmap"):
        return AXIS
    return None


def step_axis_name(config: RunConfig) -> str | None:
    """The axis the step body reduces over (gradients, loss): only shard_map and pmap write collectives."""
    return AXIS if config.devices > 1 and config.jax_parallel in ("shard_map", "pmap") else None


def per_replica(config: RunConfig, params: Any) -> Any:
    """The parameters as the step differentiates them. Under shard_map, replicated parameters are marked
    device-varying first: otherwise JAX's transpose already sums their gradient over the replicas, and the
    explicit pmean below would count it again. (pmap has no such typing: its gradients are per replica.)"""
    if config.devices > 1 and config.jax_parallel == "shard_map":
        return jax.lax.pcast(params, AXIS, to="varying")
    return params


def reduce_across_replicas(config: RunConfig, grads: Any, loss: jax.Array,
                           batch_stats: Any) -> tuple[Any, jax.Array, Any]:
    """Inside a shard_map / pmap step: the global batch's mean gradient and loss; BatchNorm statistics
    either already global (sync_bn) or replica 0's."""
    axis = step_axis_name(config)
    if axis is None:
        return grads, loss, batch_stats
    grads = jax.lax.pmean(grads, axis)
    loss = jax.lax.pmean(loss, axis)
    if bn_axis_name(config) is None:
        first = jax.lax.axis_index(axis) == 0  # replica 0's, by a psum (its result is replicated by type)
        batch_stats = jax.tree.map(lambda s: jax.lax.psum(jnp.where(first, s, jnp.zeros_like(s)), axis), batch_stats)
    return grads, loss, batch_stats


def pipeline_mesh(config: RunConfig) -> Mesh:
    """One device per pipeline stage, along the "stage" axis."""
    stages = config.pipeline_stages
    if config.compile != "compiled":
        raise ConfigError("the JAX pipeline needs compile=compiled: its schedule is one jitted shard_map program")
    devices = jax.local_devices()
    if len(devices) < stages:
        raise ConfigError(f"pipeline_stages={stages} needs {stages} devices but JAX sees {len(devices)} "
                          f"({devices[0].platform}); on a CPU host set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={stages} (the driver does)")
    return Mesh(np.array(devices[:stages]), (STAGE_AXIS,))


def place(mesh: Mesh, tree: Any) -> Any:
    """``tree`` replicated on every device of ``mesh`` (the pipeline's state and batches: on both stages)."""
    return jax.device_put(tree, NamedSharding(mesh, P()))
