"""The single-device technique switches on the JAX side; torch_impl/techniques.py mirrors them. Mixed precision is
jax_impl/amp.py's, compilation jax_impl/compilation.py's."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from common.applicability import no_effect_notes
from common.config import RunConfig

# torch's set_float32_matmul_precision names -> JAX's: "high" is TF32 in torch, so it maps to tensorfloat32
# (JAX's own "high" is bf16_3x, a different thing).
MATMUL_PRECISION = {"highest": "float32", "high": "tensorfloat32", "medium": "bfloat16"}


def apply_flags(config: RunConfig) -> list[str]:
    """Sets JAX's default matmul precision explicitly (its GPU default is not full fp32); returns notes."""
    jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[config.matmul_precision])
    return no_effect_notes(config, "jax", jax.devices()[0].platform)  # the one table of both frameworks


def param_dtype(config: RunConfig) -> Any:
    return jnp.float64 if config.precision == "fp64" else jnp.float32
