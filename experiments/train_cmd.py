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

from common.config import add_config_arguments, config_from_args
from common.results import atomic_write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax"), required=True)
    parser.add_argument("--out", default="results/train")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from experiments.defaults import with_default_data
    from experiments.worker import speaks_for_the_job

    config = config_from_args(args)
    config = with_default_data(config)
    if args.framework == "torch":
        from torch_impl.train import fit
    else:
        from jax_impl.train import fit
    result = fit(config)
    if speaks_for_the_job(result):
        path = Path(args.out) / f"{args.framework}-result.json"
        atomic_write_text(path, json.dumps({"config": config.to_dict(), **result}, default=str, indent=1))
        step = result.get("timing", {}).get("step_s", {}).get("median", float("nan"))
        print(f"{args.framework}: {result['status']}, {result['steps_done']} steps, {result.get('replicas', 1)} replica(s), "
              f"median step {step * 1e3:.1f} ms, final loss {result['losses'][-1] if result['losses'] else float('nan'):.4f}; "
              f"{path}")
    return 0 if result["status"] == "ok" else 1
