"""Mixed precision on the JAX side: the model computes in a dtype of its own, and fp16 carries a dynamic loss scale
in the train state (GradScaler's rules); torch_impl/amp.py is the torch twin (autocast, GradScaler)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from common.config import RunConfig

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16, "fp64": jnp.float64}


def compute_dtype(config: RunConfig) -> Any:
    """Compute dtype of the model; parameters, BatchNorm statistics and the loss stay fp32."""
    return COMPUTE_DTYPES[config.precision]


class LossScale(NamedTuple):
    """Dynamic loss scaling with GradScaler's rules: on inf/nan halve and skip the step; after
    ``growth_interval`` good steps in a row, double. Every setting is a value of the state, none a constant of the
    compiled step: runs that differ only in the scale's initial value or interval run one program."""

    scale: jax.Array
    good_steps: jax.Array
    growth_interval: jax.Array

    @classmethod
    def create(cls, config: RunConfig) -> LossScale:
        initial = config.loss_scale_init if config.precision == "fp16" else 1.0
        return cls(jnp.asarray(initial, jnp.float32), jnp.asarray(0, jnp.int32),
                   jnp.asarray(config.loss_scale_growth_interval, jnp.int32))

    def update(self, finite: jax.Array) -> LossScale:
        good = jnp.where(finite, self.good_steps + 1, 0)
        grow = good >= self.growth_interval
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2.0, self.scale), self.scale * 0.5)
        return self._replace(scale=scale, good_steps=jnp.where(grow, 0, good).astype(jnp.int32))


def all_finite(tree: Any) -> jax.Array:
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
