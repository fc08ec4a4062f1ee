"""Entry point of an isolated job: ``python -m experiments.worker TASK PAYLOAD_JSON OUT_JSON``.

Imports only the framework the job needs, so a torch job never loads JAX and the reverse.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.results import atomic_write_text


def _loader_bench(payload: dict[str, Any]) -> dict[str, Any]:
    from experiments.loader_bench import measure_in_process

    return measure_in_process(payload)


def _train(payload: dict[str, Any]) -> dict[str, Any]:
    from common.config import RunConfig

    config = RunConfig.from_dict(payload["config"])
    if payload["framework"] == "torch":
        from torch_impl.train import fit
    else:
        from jax_impl.train import fit
    return fit(config)


def _init_weights(payload: dict[str, Any]) -> dict[str, Any]:
    from common.config import RunConfig
    from torch_impl.train import export_initial_weights

    export_initial_weights(RunConfig.from_dict(payload["config"]), payload["num_classes"], payload["path"])
    return {"status": "ok", "path": payload["path"]}


def _matmul_rate(payload: dict[str, Any]) -> dict[str, Any]:
    from experiments.report import measure_matmul_rate

    return measure_matmul_rate()


def _overhead(payload: dict[str, Any]) -> dict[str, Any]:
    from common.config import RunConfig
    from experiments.overhead import measure_in_process

    return measure_in_process(payload["framework"], RunConfig.from_dict(payload["config"]))


def _infer(payload: dict[str, Any]) -> dict[str, Any]:
    from experiments.infer import measure_in_process

    return measure_in_process(payload)


TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "loader-bench": _loader_bench,
    "train": _train,
    "init-weights": _init_weights,
    "matmul-rate": _matmul_rate,
    "overhead": _overhead,
    "infer": _infer,
}


def speaks_for_the_job(result: dict[str, Any]) -> bool:
    """Rank / process 0 writes the result of a run over several processes (torchrun or jax.distributed); a
    failure before the trainer knew its place is written by any process that has one to tell."""
    if "process_index" in result:
        return result["process_index"] == 0
    return os.environ.get("RANK", os.environ.get("TWINRUN_PROCESS_ID", "0")) == "0" or result.get("status") == "failed"


def main(argv: list[str]) -> int:
    task, payload, out = argv[0], json.loads(argv[1]), Path(argv[2])
    try:
        result = TASKS[task](payload)
    except Exception as exc:  # the job failed; say why in its result instead of losing it
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    if speaks_for_the_job(result):
        atomic_write_text(out, json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
