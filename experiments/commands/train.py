"""``twinrun train``: one framework's trainer in *this* process, the entry point for launchers.

Under torchrun (one machine or several) every process runs this; torch_impl/parallel.py reads RANK,
WORLD_SIZE and LOCAL_RANK from torchrun's environment, and rank 0 writes the result:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m experiments train --framework torch --devices 16 --batch-size 128 --epochs 1 --out results/ddp

With JAX, one process per machine joins through jax.distributed (SLURM and Open MPI are detected; otherwise
name the coordinator and each process's index):

    JAX_COORDINATOR_ADDRESS=HOST:1234 TWINRUN_PROCESS_ID=0 \\
        python -m experiments train --framework jax --compile compiled --processes 2 --devices 16 ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.results import RunResult
from experiments.catalog.defaults import with_default_data
from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.frameworks import fit_function
from experiments.execution.runner import speaks_for_the_job
from experiments.execution.store import atomic_write_text, writable_folder
from experiments.options import add_framework_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser, both=False)
    parser.add_argument("--out", default="results/train", help="folder of <framework>-result.json (rank 0 writes it)")
    add_config_arguments(parser)


def summary(framework: str, result: RunResult, path: Path) -> str:
    return (f"{framework}: {result.status}, {result.steps_done} steps, {result.replicas} replica(s), "
            f"median step {result.timing.step_median_s * 1e3:.1f} ms, final loss {result.final_loss:.4f}; {path}")


def run(args: argparse.Namespace) -> int:
    writable_folder(args.out, "--out")
    config = with_default_data(config_from_args(args))
    result = fit_function(args.framework)(config)
    row = result.to_row()
    if speaks_for_the_job(row):
        path = Path(args.out) / f"{args.framework}-result.json"
        atomic_write_text(path, json.dumps({"config": config.to_dict(), **row}, default=str, indent=1))
        print(summary(args.framework, result, path))
    return 0 if result.ok else 1
