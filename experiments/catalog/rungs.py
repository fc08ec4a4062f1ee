"""The case study's ladder: one technique added per rung, and what each rung means in each framework."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.config import RunConfig

# The case study's baseline reads through a DataLoader with 2 workers; the loader rung then tunes the count.
BASELINE_WORKERS = 2


@dataclass(frozen=True)
class Rung:
    name: str
    adds: str
    torch: str  # what the rung means on each side, printed with the table
    jax: str
    overrides: Callable[[RunConfig, bool, int], dict[str, Any]]  # (base, cuda, tuned workers) -> changes


def _baseline(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {"workers": BASELINE_WORKERS}


def _loader(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {"workers": workers, "pin_mem": True, "prefetch": 4, "persistent_workers": True, "device_prefetch": 2}


def _flags(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_loader(base, cuda, workers), "cudnn_benchmark": True, "matmul_precision": "high"}


def _amp(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_flags(base, cuda, workers), "precision": "bf16"}


def _compile(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_amp(base, cuda, workers), "compile": "compiled"}


RUNGS = (
    Rung("baseline", f"{BASELINE_WORKERS} loader workers, no pinned memory, fp32 (highest), eager, flags off",
         f"eager, DataLoader({BASELINE_WORKERS} workers)",
         f"op by op (jax.disable_jit), grain {BASELINE_WORKERS} workers", _baseline),
    Rung("loader", "tuned workers, pin_memory, prefetch 4, persistent workers",
         "DataLoader(pin_memory, prefetch_factor=4, persistent)", "grain workers, prefetch 4, 2 batches on device",
         _loader),
    Rung("flags", "cudnn.benchmark, TF32 matmuls ('high')",
         "cudnn.benchmark, set_float32_matmul_precision('high')", "matmul precision tensorfloat32 (XLA autotunes)",
         _flags),
    Rung("amp", "mixed precision", "autocast (fp16 + GradScaler on CUDA, bf16 elsewhere)", "bf16 compute, fp32 params",
         _amp),
    Rung("compile", "compilation", "torch.compile", "jax.jit (donated state)", _compile),
)


def default_loader_workers() -> int:
    """The loader rung's worker count unless given: the CPU count, at most 8."""
    return min(os.cpu_count() or 2, 8)


def rung_config(rung: Rung, base: RunConfig, framework: str, cuda: bool, workers: int) -> RunConfig:
    changes = rung.overrides(base, cuda, workers)
    if framework == "torch" and cuda and changes.get("precision") == "bf16":
        changes["precision"] = "fp16"  # the case study's AMP rung: fp16 autocast + GradScaler on the GPU
    return base.replace(**changes)


def skip_reason(config: RunConfig, framework: str) -> str | None:
    """Over several devices, JAX's op-by-op rungs are not run: JAX data parallel is a jitted program (op by op
    on sharded arrays stalled XLA:CPU here), so JAX's ladder starts at the compile rung."""
    if framework == "jax" and config.devices > 1 and config.compile != "compiled":
        return f"JAX data parallel is jitted: op by op on {config.devices} devices is not run (see the compile rung)"
    return None
