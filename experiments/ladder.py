"""``twinrun ladder``: the case study's rungs, one technique added at a time, in both frameworks."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.config import RunConfig
from common.results import ResultStore
from common.versions import host_info
from experiments.paired import FRAMEWORKS, paired_config, run_framework


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


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--data", default=None, help="CIFAR archive/folder; default: a generated CIFAR-100-format archive")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="the loader rung's worker count (default: CPU count, at most 8)")
    parser.add_argument("--name", default=None, help="results folder name (default: ladder-<preset>)")
    parser.add_argument("--results", default="results")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows and start over")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one run")
    # test hook: make one run die, to show that the ladder records it failed and goes on
    parser.add_argument("--inject-failure", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from experiments.defaults import default_archive
    from experiments.report import write_report

    if args.repeats < 1:
        raise SystemExit("twinrun ladder: error: --repeats must be at least 1")
    preset = dict(PRESETS[args.preset])
    if args.steps is not None:
        preset["steps"] = args.steps
    data = args.data or str(default_archive("cifar100"))
    base = RunConfig(data=data, **preset)
    out = Path(args.results) / (args.name or f"ladder-{args.preset}")
    store = ResultStore(out / "runs.jsonl")
    if args.fresh:
        store.clear()
    base = paired_config(base, out / "weights")  # same initial weights for every rung and framework
    cuda = _cuda_available()
    workers = args.workers if args.workers is not None else min(os.cpu_count() or 2, 8)
    frameworks = FRAMEWORKS if args.framework == "both" else (args.framework,)
    finished = store.finished_keys()
    plan = [(rung, fw, r) for r in range(args.repeats) for rung in RUNGS for fw in frameworks]
    console = Console(width=None if Console().is_terminal else 180)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("ladder", total=len(plan))
        for rung, framework, repeat in plan:
            key = f"ladder/{rung.name}/{framework}/r{repeat}"
            if key in finished:
                progress.advance(task)
                continue
            config = rung_config(rung, base, framework, cuda, workers)
            if args.inject_failure == f"{rung.name}:{framework}":
                config = config.replace(fail_after_step=1)
            progress.update(task, description=f"{rung.name:>8} {framework:<5} repeat {repeat + 1}/{args.repeats}")
            started = time.time()
            result = run_framework(framework, config, args.timeout)
            row = {"key": key, "command": "ladder", "rung": rung.name, "rung_index": RUNGS.index(rung),
                   "framework": framework, "repeat": repeat, "preset": args.preset, "config": config.to_dict(),
                   "host": host_info(), "wall_s": time.time() - started,
                   **{k: v for k, v in result.items() if k != "traceback"}}
            store.add(row)
            if row["status"] != "ok":
                progress.console.print(f"[red]{key} {row['status']}[/]: {str(row.get('error', ''))[:300]}")
            progress.advance(task)
    report = write_report(out, console=console)
    console.print(f"rows: {store.path}\nreport: {report}")
    return 0
