"""``twinrun ladder``: the case study's rungs, one technique added at a time, in both frameworks."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable

from common.config import RunConfig
from experiments.plan import (
    PlannedRun,
    add_plan_arguments,
    console_for_output,
    execute,
    prepare,
)


@dataclass(frozen=True)
class Rung:
    name: str
    adds: str
    torch: str  # what the rung means on each side, printed with the table
    jax: str
    overrides: Callable[[RunConfig, bool, int], dict[str, Any]]  # (base, cuda, tuned workers) -> changes


def _loader(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {"workers": workers, "pin_mem": True, "prefetch": 4, "persistent_workers": True, "device_prefetch": 2}


def _flags(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_loader(base, cuda, workers), "cudnn_benchmark": True, "matmul_precision": "high"}


def _amp(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_flags(base, cuda, workers), "precision": "bf16"}


def _compile(base: RunConfig, cuda: bool, workers: int) -> dict[str, Any]:
    return {**_amp(base, cuda, workers), "compile": "compiled"}


RUNGS = (
    Rung("baseline", "2 loader workers, no pinned memory, fp32 (highest), eager, flags off",
         "eager, DataLoader(2 workers)", "op by op (jax.disable_jit), grain 2 workers", lambda b, c, w: {}),
    Rung("loader", "tuned workers, pin_memory, prefetch 4, persistent workers",
         "DataLoader(pin_memory, prefetch_factor=4, persistent)", "grain workers, prefetch 4, 2 batches on device", _loader),
    Rung("flags", "cudnn.benchmark, TF32 matmuls ('high')",
         "cudnn.benchmark, set_float32_matmul_precision('high')", "matmul precision tensorfloat32 (XLA autotunes)", _flags),
    Rung("amp", "mixed precision", "autocast (fp16 + GradScaler on CUDA, bf16 elsewhere)", "bf16 compute, fp32 params", _amp),
    Rung("compile", "compilation", "torch.compile", "jax.jit (donated state)", _compile),
)

PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job: small enough for 2 CPU cores in <= 10 minutes with 3 repeats.
    "cpu": {"model": "resnet18", "width": 0.125, "batch_size": 64, "steps": 8, "epochs": None, "timing_warmup": 2,
            "eval_batches": 4, "lr": 0.05, "warmup_steps": 2},
    "tiny": {"model": "resnet18", "width": 0.125, "batch_size": 16, "steps": 3, "epochs": None, "timing_warmup": 1,
             "eval_batches": 1, "lr": 0.05},
    "article": {"model": "resnet50", "stem": "cifar", "width": 1.0, "batch_size": 128, "steps": 40, "epochs": None,
                "timing_warmup": 10, "eval_batches": 10, "lr": 0.1, "warmup_steps": 5},
}


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


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser, "ladder-<preset>")
    parser.add_argument("--workers", type=int, default=None, help="the loader rung's worker count (default: CPU count, at most 8)")
    # test hook: make one run die, to show that the ladder records it failed and goes on
    parser.add_argument("--inject-failure", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from experiments.report import write_report

    prepared = prepare(args, f"ladder-{args.preset}")
    base, out, store, frameworks = prepared.base, prepared.out, prepared.store, prepared.frameworks
    cuda = _cuda_available()
    workers = args.workers if args.workers is not None else min(os.cpu_count() or 2, 8)
    plan = []
    for repeat in range(args.repeats):
        for index, rung in enumerate(RUNGS):
            for framework in frameworks:
                config = rung_config(rung, base, framework, cuda, workers)
                if args.inject_failure == f"{rung.name}:{framework}":
                    config = config.replace(fail_after_step=1)
                plan.append(PlannedRun(
                    key=f"ladder/{rung.name}/{framework}/r{repeat}", framework=framework, config=config,
                    label=f"{rung.name:>8} {framework:<5} repeat {repeat + 1}/{args.repeats}",
                    fields={"command": "ladder", "rung": rung.name, "rung_index": index, "repeat": repeat,
                            "preset": args.preset}, skip_reason=skip_reason(config, framework)))
    console = console_for_output()
    execute(plan, store, "ladder", args.timeout, console)
    report = write_report(out, console=console)
    console.print(f"rows: {store.path}\nreport: {report}")
    return 0
