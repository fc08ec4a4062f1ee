"""jit's compilations on the JAX side: programs compiled and seconds spent, counted from jax.monitoring's events, and
XLA's memory analysis of a compiled step; torch_impl/compilation.py counts torch.compile's graphs the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

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


def measure_xla_memory(step_fn: Callable, state: Any, images: jax.Array, labels: jax.Array) -> dict[str, int]:
    """XLA's compiled memory analysis of the jitted step: temp (activations kept for backward, workspace)
    and argument bytes. The timed step's own executable, from jit's cache: no second compilation."""
    analysis = step_fn.lower(state, images, labels, jnp.asarray(False)).compile().memory_analysis()  # type: ignore[attr-defined]
    if analysis is None:
        return {}
    return {"xla_temp_bytes": int(analysis.temp_size_in_bytes),
            "xla_argument_bytes": int(analysis.argument_size_in_bytes),
            "xla_output_bytes": int(analysis.output_size_in_bytes)}
