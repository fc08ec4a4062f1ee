"""``twinrun sweep TECHNIQUE``: one technique's knob over several values, both frameworks, the ladder's
rows and report. Everything else stays at the preset's baseline (fp32, eager unless the sweep is about
compilation), so each sweep isolates its technique."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.config import RunConfig
from common.errors import ConfigError
from experiments.plan import (
    PlannedRun,
    add_plan_arguments,
    console_for_output,
    execute,
    prepare,
)


@dataclass(frozen=True)
class Sweep:
    name: str
    knob: str  # what is varied, for the report
    default_values: Callable[[RunConfig, bool], list[str]]  # (base config, CUDA present) -> values
    # (value, base, framework) -> config changes; None: the value has no meaning in that framework
    overrides: Callable[[str, RunConfig, str], dict[str, Any] | None]


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"sweep value '{value}' is not a whole number") from None


def _workers(value: str, base: RunConfig, framework: str) -> dict[str, Any]:
    workers = _int(value)
    return {"workers": workers, "persistent_workers": workers > 0, "prefetch": 4 if workers else 2}


def _accumulation(value: str, base: RunConfig, framework: str) -> dict[str, Any]:
    # The effective batch stays the preset's: k micro-batches of B/k (memory per micro-batch falls, the
    # update is the same one as a B batch, so the LR is not rescaled).
    k = _int(value)
    if base.batch_size % k:
        raise ConfigError(f"accumulation k={k} does not divide the batch size {base.batch_size}")
    return {"grad_accum_steps": k, "batch_size": base.batch_size // k}


def _compile_mode(value: str, base: RunConfig, framework: str) -> dict[str, Any] | None:
    if value == "eager":
        return {"compile": "eager"}
    if framework == "jax":  # jax.jit has no modes: run it once, under "default"
        return {"compile": "compiled"} if value == "default" else None
    return {"compile": "compiled", "torchcompile_mode": value}


def _workers_values(base: RunConfig, cuda: bool) -> list[str]:
    most = min(os.cpu_count() or 2, 8)
    return [str(w) for w in sorted({0, 1, 2, 4, 8} | {most}) if w <= most]


SWEEPS: dict[str, Sweep] = {s.name: s for s in (
    Sweep("workers", "loader workers (persistent, prefetch 4)", _workers_values, _workers),
    Sweep("batch-size", "batch size (LR unchanged)",
          lambda b, c: [str(b.batch_size // 2), str(b.batch_size), str(b.batch_size * 2)],
          lambda v, b, f: {"batch_size": _int(v)}),
    Sweep("accumulation", "gradient accumulation k at a fixed effective batch (micro-batch = B/k)",
          lambda b, c: ["1", "2", "4"], _accumulation),
    Sweep("checkpointing", "gradient checkpointing (activations recomputed in backward): none / stages / all",
          lambda b, c: ["none", "3,4", "all"], lambda v, b, f: {"grad_checkpointing": v}),
    Sweep("precision", "compute precision (fp16 with loss scaling; params, BN statistics and loss fp32)",
          lambda b, c: ["fp32", "bf16", "fp16"], lambda v, b, f: {"precision": v}),
    Sweep("scaling", "data-parallel replicas at a fixed per-replica batch (torch DDP processes; JAX devices, "
          "host devices on a CPU): the global batch grows with them",
          lambda b, c: ["1", "2", "4"], lambda v, b, f: {"devices": _int(v)}),
    Sweep("pipeline", "pipeline stages at a fixed batch (2: GPipe over pipeline_micro_batches; torch processes, "
          "JAX devices, host devices on a CPU)",
          lambda b, c: ["1", "2"], lambda v, b, f: {"pipeline_stages": _int(v)}),
    Sweep("compile-mode", "torch.compile mode (JAX: jax.jit, which has no modes)",
          lambda b, c: ["eager", "default", "reduce-overhead", "max-autotune"] if c else ["eager", "default"],
          _compile_mode),
)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("technique", choices=tuple(SWEEPS))
    parser.add_argument("--values", nargs="+", default=None, help="values, e.g. --values none 3,4 all (default: per technique)")
    parser.add_argument("--compile", choices=("native", "eager", "compiled"), default="native",
                        help="mode of both frameworks outside the compile-mode sweep; native (default): torch eager, "
                             "JAX jit, how each is normally run (op-by-op JAX is dispatch-bound and hides every technique)")
    add_plan_arguments(parser, "sweep-<technique>-<preset>")


def mode_for(compile_option: str, framework: str) -> str:
    if compile_option == "native":
        return "compiled" if framework == "jax" else "eager"
    return compile_option


def sweep_plan(sweep: Sweep, values: list[str], base: RunConfig, frameworks: tuple[str, ...],
               repeats: int, preset: str, compile_option: str = "native") -> list[PlannedRun]:
    plan = []
    for repeat in range(repeats):
        for index, value in enumerate(values):
            for framework in frameworks:
                changes = sweep.overrides(value, base, framework)
                if changes is None:
                    continue
                plan.append(PlannedRun(
                    key=f"sweep/{sweep.name}/{value}/{framework}/r{repeat}", framework=framework,
                    config=base.replace(**{"compile": mode_for(compile_option, framework), **changes}), label=f"{sweep.name}={value} {framework:<5} repeat {repeat + 1}/{repeats}",
                    fields={"command": "sweep", "technique": sweep.name, "knob": sweep.knob, "value": value,
                            "value_index": index, "repeat": repeat, "preset": preset, "mode": compile_option}))
    return plan


def run(args: argparse.Namespace) -> int:
    from experiments.ladder import _cuda_available
    from experiments.report import write_report

    sweep = SWEEPS[args.technique]
    prepared = prepare(args, f"sweep-{sweep.name}-{args.preset}")
    values = args.values or sweep.default_values(prepared.base, _cuda_available())
    values = [v.strip() for v in values if v.strip()]
    for value in values:  # a bad value fails here, before any run
        for framework in prepared.frameworks:
            changes = sweep.overrides(value, prepared.base, framework)
            if changes is not None:
                prepared.base.replace(**changes)
    plan = sweep_plan(sweep, values, prepared.base, prepared.frameworks, args.repeats, args.preset, args.compile)
    console = console_for_output()
    execute(plan, prepared.store, f"sweep {sweep.name}", args.timeout, console)
    report = write_report(prepared.out, console=console)
    console.print(f"rows: {prepared.store.path}\nreport: {report}")
    return 0
