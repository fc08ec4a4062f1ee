"""The case study's ladder: one technique added per rung (in the article's order, or ``--rungs``), and the ablations
"top rung minus X", which tell what each technique buys once the others are on; what each means in each framework.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.config import RunConfig
from common.errors import ConfigError

# The case study's baseline reads through a DataLoader with 2 workers; the loader rung then tunes the count.
BASELINE_WORKERS = 2
# XLA:CPU switches the flags rung turns on for JAX on a CPU (the article: a framework's built-in options first).
# Empty: none measured faster here (README, "JAX's flags on a CPU"); torch ignores the field with a note.
JAX_CPU_XLA_FLAGS = ""


@dataclass(frozen=True)
class Device:
    """What the rungs need to know about the device: mixed precision is fp16 + loss scaling on CUDA (the case
    study's, in both frameworks) and bf16 elsewhere."""

    cuda: bool
    workers: int  # the loader rung's worker count

    @property
    def amp_dtype(self) -> str:
        return "fp16" if self.cuda else "bf16"


@dataclass(frozen=True)
class Technique:
    name: str
    adds: str
    torch: str  # what it means on each side, printed with the table
    jax: str
    changes: Callable[[Device], dict[str, Any]]


# What the loader technique changes: the input pipeline only, no compiled program (so top minus loader reads the
# top rung's compile cache: execution/plan.py)
LOADER_FIELDS = ("workers", "pin_mem", "prefetch", "persistent_workers", "device_prefetch")


def _loader(device: Device) -> dict[str, Any]:
    return dict(zip(LOADER_FIELDS, (device.workers, True, 4, True, 2), strict=True))


def _flags(device: Device) -> dict[str, Any]:
    xla = {} if device.cuda or not JAX_CPU_XLA_FLAGS else {"xla_flags": JAX_CPU_XLA_FLAGS}
    return {"cudnn_benchmark": True, "matmul_precision": "high", **xla}


def _amp(device: Device) -> dict[str, Any]:
    return {"precision": device.amp_dtype}


def _compile(device: Device) -> dict[str, Any]:
    # the whole update in both frameworks, the scope that makes them compile the same computation (jax.jit of the
    # step is JAX's idiom; torch.compile(model) alone would leave torch's optimizer eager): said in every row's
    # config and in the report's rung table
    return {"compile": "compiled", "compile_scope": "step"}


TECHNIQUES = {technique.name: technique for technique in (
    Technique("loader", "tuned workers, pin_memory, prefetch 4, persistent workers",
              "DataLoader(pin_memory, prefetch_factor=4, persistent)", "grain workers, prefetch 4, 2 batches on device",
              _loader),
    Technique("flags", "cudnn.benchmark, TF32 matmuls ('high')",
              "cudnn.benchmark, set_float32_matmul_precision('high')",
              "matmul precision tensorfloat32 (XLA autotunes)"
              + (f"; on a CPU, XLA_FLAGS {JAX_CPU_XLA_FLAGS}" if JAX_CPU_XLA_FLAGS
                 else "; on a CPU no XLA:CPU flag measured faster (README)"), _flags),
    Technique("amp", "mixed precision, the same dtype in both frameworks: fp16 + loss scaling on CUDA, bf16 elsewhere",
              "autocast; GradScaler with fp16",
              "compute in the dtype, fp32 params, BN statistics and loss; dynamic loss scale with fp16", _amp),
    Technique("compile", "compilation of the whole update (compile_scope step: forward, backward and the optimizer)",
              "torch.compile(model) and torch.compile of optimizer.step (LR as a tensor, fused kernel)",
              "jax.jit of the step (donated state)", _compile),
)}
DEFAULT_ORDER = ("loader", "flags", "amp", "compile")  # the article's
BASELINE_TEXT = (f"{BASELINE_WORKERS} loader workers, no pinned memory, fp32 (highest), eager, flags off",
                 f"eager, DataLoader({BASELINE_WORKERS} workers)",
                 f"eager: the step without jax.jit, each operation dispatched on its own; grain {BASELINE_WORKERS} "
                 "workers")


@dataclass(frozen=True)
class Rung:
    name: str  # "baseline", the technique a cumulative rung adds, or "minus-X" for an ablation
    techniques: tuple[str, ...]  # the techniques on in this rung, in the ladder's order
    index: int  # place in the report
    ablation: str | None = None  # the technique an ablation leaves out of the top rung

    @property
    def title(self) -> str:
        return f"top - {self.ablation}" if self.ablation else self.name


def parse_order(text: str | None) -> tuple[str, ...]:
    """``--rungs`` as the techniques' order, e.g. "compile,loader,flags,amp" (a subset is allowed)."""
    if text is None:
        return DEFAULT_ORDER
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TECHNIQUES]
    if unknown or not names:
        raise ConfigError(f"--rungs: unknown technique(s) {', '.join(unknown) or '(none given)'}; known: "
                          f"{', '.join(DEFAULT_ORDER)} (the baseline always comes first)")
    if len(set(names)) != len(names):
        raise ConfigError(f"--rungs names a technique twice: {text}")
    return names


def ladder_rungs(order: tuple[str, ...] = DEFAULT_ORDER, ablations: bool = True) -> list[Rung]:
    """The baseline, one cumulative rung per technique, then "top minus X" for every technique X but the last
    one added (top minus that one is the rung below the top, measured already)."""
    rungs = [Rung("baseline", (), 0)]
    rungs += [Rung(name, order[:i + 1], i + 1) for i, name in enumerate(order)]
    if ablations:
        rungs += [Rung(f"minus-{name}", tuple(t for t in order if t != name), len(order) + 1 + i, ablation=name)
                  for i, name in enumerate(order[:-1])]
    return rungs


def default_loader_workers() -> int:
    """The loader rung's worker count unless given: the CPU count, at most 8."""
    return min(os.cpu_count() or 2, 8)


def rung_config(rung: Rung, base: RunConfig, device: Device) -> RunConfig:
    """The rung's config: the baseline's, then each of its techniques' changes in order (the same in both
    frameworks; a knob one framework lacks is accepted there with a note)."""
    changes: dict[str, Any] = {"workers": BASELINE_WORKERS}
    for name in rung.techniques:
        changes.update(TECHNIQUES[name].changes(device))
    return base.replace(**changes)


def skip_reason(config: RunConfig, framework: str) -> str | None:
    """Over several devices, JAX's eager rungs are not run: JAX data parallel is a jitted program (eager on sharded
    arrays stalled XLA:CPU here), so JAX's ladder starts at the compile rung."""
    if framework == "jax" and config.devices > 1 and config.compile != "compiled":
        return f"JAX data parallel is jitted: eager on {config.devices} devices is not run (see the compile rung)"
    return None
