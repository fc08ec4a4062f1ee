"""Pipeline parallel on the JAX side: the ResNet cut into 2 stages (stem + layer1..2 | layer3..4 + classifier),
one per device, run as a GPipe schedule over micro-batches inside one shard_map program. torch_impl/pipeline.py
mirrors it with torch.distributed.pipelining.

At tick t the first stage runs micro-batch t and the second runs micro-batch t-1, whose activations came over
by ``ppermute``; the stages are the two branches of a ``lax.switch`` on the device's stage index. The backward
schedule is not written out: jax.grad differentiates the forward one (a ppermute's transpose sends the
activation gradients back). Each device holds both stages' parameters, since an SPMD program has one shape,
but computes and differentiates only its own stage's.

BatchNorm normalises each micro-batch on its own, as in torch's pipeline: the step then equals gradient
accumulation over the same micro-batches on the unsplit model (and, with GroupNorm, the whole batch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from common.config import PIPELINE_SPLIT_STAGE, RunConfig
from jax_impl.checkpoint import TrainState
from jax_impl.mesh import STAGE_AXIS as AXIS
from jax_impl.mesh import pipeline_mesh
from jax_impl.models import ResNet
from jax_impl.train import Model, Optimizer, StepFn

STAGES = 2

LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def notes(config: RunConfig) -> list[str]:
    """What the result should say about this pipeline (torch_impl/pipeline.py's mirror)."""
    said = [f"pipeline: {STAGES} stages, GPipe over {config.pipeline_micro_batches} micro-batches (shard_map + "
            f"ppermute)"]
    if jax.local_devices()[0].platform == "cpu":
        # Measured here: the weight gradient of one 3x3 conv (batch 64, 16 channels) takes 5.5 ms jitted and
        # 304 ms inside a lax.switch branch, where XLA:CPU leaves it in a non-canonical layout (the class of
        # jax-ml/jax#12868, convolutions inside loop bodies). The forward is as fast in a branch as outside.
        said.append("pipeline on XLA:CPU: convolution gradients inside the stages' lax.switch branches run unoptimised "
                    "(~50x slower than outside a branch), so this step time measures that, not the schedule")
    return said


def stage_modules(model: ResNet) -> tuple[ResNet, ResNet]:
    """The two halves of ``model``; they read the whole model's parameter tree, each its own names."""
    return (model.clone(part="front", split_stage=PIPELINE_SPLIT_STAGE),
            model.clone(part="back", split_stage=PIPELINE_SPLIT_STAGE))


def _make_loss(config: RunConfig, model: ResNet, mesh: Mesh, loss_fn: LossFn) -> Callable:
    """(params, batch_stats, images, labels) -> (mean micro-batch loss, new batch_stats), pipelined."""
    front, back = stage_modules(model)
    m = config.pipeline_micro_batches

    def run(part: ResNet, params: Any, stats: Any, x: jax.Array) -> tuple[jax.Array, Any]:
        out, updates = part.apply({"params": params, "batch_stats": stats}, x, train=True, mutable=["batch_stats"])
        return out, {**stats, **updates.get("batch_stats", {})}  # this stage's statistics updated, the rest kept

    def per_device(params: Any, stats: Any, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, Any]:
        stage = jax.lax.axis_index(AXIS)
        # Varying per device: the gradient of the replicated input is then the sum of each stage's own part.
        initial_stats = stats
        params, stats = jax.lax.pcast((params, stats), AXIS, to="varying")
        xs, ys = images.reshape(m, -1, *images.shape[1:]), labels.reshape(m, -1)
        carried = jax.eval_shape(lambda: run(front, params, stats, xs[0])[0])
        incoming = jax.lax.pcast(jnp.zeros(carried.shape, carried.dtype), AXIS, to="varying")
        total = jax.lax.pcast(jnp.zeros((), jnp.result_type(float)), AXIS, to="varying")
        for tick in range(m + STAGES - 1):
            def first_stage(operands, tick=tick):
                stats, _ = operands
                out, stats = run(front, params, stats, xs[min(tick, m - 1)])
                return out, jnp.zeros_like(total), stats

            def second_stage(operands, tick=tick):
                stats, incoming = operands
                logits, stats = run(back, params, stats, incoming)
                return jnp.zeros_like(incoming), loss_fn(logits, ys[max(tick - 1, 0)]).astype(total.dtype), stats

            out, loss, new_stats = jax.lax.switch(stage, [first_stage, second_stage], (stats, incoming))
            busy = jnp.where(stage == 0, tick < m, tick >= 1)  # the fill and drain ticks leave one stage idle
            stats = jax.tree.map(lambda new, old: jnp.where(busy, new, old), new_stats, stats)
            total = total + jnp.where(busy, loss, 0)
            incoming = jax.lax.ppermute(out, AXIS, perm=[(0, 1)])
        # Each device moved only its own stage's statistics: the sum of the two moves is the whole update.
        stats = jax.tree.map(lambda new, old: old + jax.lax.psum(new - old, AXIS), stats, initial_stats)
        return jax.lax.psum(total, AXIS) / m, stats

    return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P(), P()), out_specs=(P(), P()))


def make_train_step(config: RunConfig, model: Model, optimizer: Optimizer, loss_fn: LossFn) -> StepFn:
    """The trainer's step signature (state, images, labels, inject) -> (state, loss), pipelined over the stages' mesh
    (jax_impl/mesh.py's ``pipeline_mesh``, where the state and batches are placed) and jitted."""
    module, _ = model
    tx = optimizer.tx
    pipelined = _make_loss(config, module, pipeline_mesh(config), loss_fn)

    def step(state: TrainState, images: jax.Array, labels: jax.Array,
             inject_inf: jax.Array) -> tuple[TrainState, jax.Array]:
        (loss, batch_stats), grads = jax.value_and_grad(pipelined, has_aux=True)(state.params, state.batch_stats,
                                                                                 images, labels)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), batch_stats, opt_state, state.loss_scale), loss

    return jax.jit(step, donate_argnums=(0,))
