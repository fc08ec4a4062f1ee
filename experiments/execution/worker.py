"""Entry point of an isolated job: ``python -m experiments.execution.worker TASK PAYLOAD_JSON OUT_JSON``.

Imports only the framework the job needs (execution/frameworks.py imports them on first use), so a torch job
never loads JAX and the reverse. A train job writes its RunResult's row; the other tasks write their own rows.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.config import RunConfig
from experiments.execution import device, frameworks, inference, loader_bench, overhead
from experiments.execution.runner import speaks_for_the_job
from experiments.execution.store import atomic_write_text

Task = Callable[[dict[str, Any]], dict[str, Any]]


def _train(payload: dict[str, Any]) -> dict[str, Any]:
    fit = frameworks.fit_function(payload["framework"])
    return fit(RunConfig.from_dict(payload["config"])).to_row()


def _init_weights(payload: dict[str, Any]) -> dict[str, Any]:
    train = frameworks.module(frameworks.INITIALISER, "train")
    train.export_initial_weights(RunConfig.from_dict(payload["config"]), payload["num_classes"], payload["path"])
    return {"status": "ok", "path": payload["path"]}


def _matmul_rate(payload: dict[str, Any]) -> dict[str, Any]:
    return device.measure_matmul_rate()


def _overhead(payload: dict[str, Any]) -> dict[str, Any]:
    return overhead.measure_in_process(payload["framework"], RunConfig.from_dict(payload["config"]))


TASKS: dict[str, Task] = {
    "loader-bench": loader_bench.measure_in_process,
    "train": _train,
    "init-weights": _init_weights,
    "matmul-rate": _matmul_rate,
    "overhead": _overhead,
    "infer": inference.measure_in_process,
}


def main(argv: list[str]) -> int:
    task, payload, out = argv[0], json.loads(argv[1]), Path(argv[2])
    try:
        result = TASKS[task](payload)
    except Exception as exc:  # the job failed; say why in its result instead of losing it
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()[-4000:]}
    if speaks_for_the_job(result):
        atomic_write_text(out, json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
