"""The single-device technique switches on the JAX side; torch_impl/techniques.py mirrors them."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from common.applicability import no_effect_notes
from common.config import RunConfig

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16, "fp64": jnp.float64}
# torch's set_float32_matmul_precision names -> JAX's: "high" is TF32 in torch, so it maps to tensorfloat32
# (JAX's own "high" is bf16_3x, a different thing).
MATMUL_PRECISION = {"highest": "float32", "high": "tensorfloat32", "medium": "bfloat16"}


# jax.monitoring's duration events of one compilation: tracing to a jaxpr, lowering to MLIR, XLA's compile
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_compile_s = [0.0]
_backend_compiles = [0]


def _count_compile(event: str, duration_s: float, **_: Any) -> None:
    if event in COMPILE_EVENTS:
        _compile_s[0] += duration_s
    if event == COMPILE_EVENTS[-1]:
        _backend_compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def _count_cache_hit(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":  # a program read from the persistent cache: built all the same
        _backend_compiles[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


def compile_count() -> int:
    """Programs XLA has compiled in this process (every jit, pmap and op-by-op program): the count a function
    without a jit cache of its own (pmap's) is read from, around its calls."""
    return _backend_compiles[0]




def compile_seconds() -> float:
    """Seconds JAX has spent compiling in this process (every jit program: a new shape's too)."""
    return _compile_s[0]


def apply_flags(config: RunConfig) -> list[str]:
    """Sets JAX's default matmul precision explicitly (its GPU default is not full fp32); returns notes."""
    jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[config.matmul_precision])
    return no_effect_notes(config, "jax", jax.devices()[0].platform)  # the one table of both frameworks


def compute_dtype(config: RunConfig) -> Any:
    """Compute dtype of the model; parameters, BatchNorm statistics and the loss stay fp32."""
    return COMPUTE_DTYPES[config.precision]


def param_dtype(config: RunConfig) -> Any:
    return jnp.float64 if config.precision == "fp64" else jnp.float32


class LossScale(NamedTuple):
    """Dynamic loss scaling with GradScaler's rules: on inf/nan halve and skip the step; after
    ``growth_interval`` good steps in a row, double."""

    scale: jax.Array
    good_steps: jax.Array

    @classmethod
    def create(cls, config: RunConfig) -> LossScale:
        initial = config.loss_scale_init if config.precision == "fp16" else 1.0
        return cls(jnp.asarray(initial, jnp.float32), jnp.asarray(0, jnp.int32))

    def update(self, finite: jax.Array, growth_interval: int) -> LossScale:
        good = jnp.where(finite, self.good_steps + 1, 0)
        grow = good >= growth_interval
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2.0, self.scale), self.scale * 0.5)
        return LossScale(scale, jnp.where(grow, 0, good).astype(jnp.int32))


def all_finite(tree: Any) -> jax.Array:
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
