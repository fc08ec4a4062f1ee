"""Paired runs: one RunConfig through both frameworks, from the same initial weights, each in its own process."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from common.config import RunConfig
from common.results import RunResult
from common.workloads import num_classes, workload_for
from experiments.execution.frameworks import INITIALISER
from experiments.execution.runner import COMPILE_CACHE, run_isolated


def initial_weights(config: RunConfig, folder: Path, classes: int) -> Path:
    """The torch-initialised weights for this model and seed (made once, in a torch-only process: the job names its
    framework, so it is forked from the torch zygote, as the runs after it are; a fresh interpreter took ~4 s)."""
    identity = {k: config.to_dict()[k] for k in ("model", "stem", "width", "norm", "zero_init_residual", "seed")}
    digest = hashlib.sha1(json.dumps({**identity, "classes": classes}, sort_keys=True).encode()).hexdigest()[:12]
    path = folder / f"init-{digest}.npz"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        result = run_isolated("init-weights", {"framework": INITIALISER, "config": config.to_dict(),
                                               "num_classes": classes, "path": str(path)})
        if result["status"] != "ok":
            raise RuntimeError(f"could not make initial weights: {result['error']}")
    return path


def paired_config(config: RunConfig, folder: Path) -> RunConfig:
    """``config`` with ``init_weights`` set, so both frameworks start from the same weights."""
    if config.init_weights or workload_for(config.model).missing(INITIALISER):
        return config  # given; or a workload with no model in the initialising framework: each starts its own
    classes = num_classes(config)  # also a clear error for a missing or corrupt data set, before any run
    return config.replace(init_weights=str(initial_weights(config, folder, classes)))


def _with_host_devices(count: int) -> dict[str, str]:
    """This environment with XLA asked for ``count`` host devices (a CPU-only JAX sees one otherwise; no effect
    on a GPU, whose devices are real)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    return {**os.environ, "XLA_FLAGS": flags}


def run_framework(framework: str, config: RunConfig, timeout_s: float | None = None,
                  cache_dir: str | None = None) -> RunResult:
    """One training run of ``framework`` in its own process(es): torchrun for torch's replicas and stages, local
    jax.distributed processes for JAX's; a process that died or timed out is a failed result with the reason.
    ``cache_dir``: the compile caches this run reads and fills (otherwise a fresh one, always cold)."""
    env, processes, launcher = None, 1, "torchrun"
    if config.pipeline_stages > 1 and framework == "torch":
        processes = config.pipeline_stages  # one process per stage
    elif config.pipeline_stages > 1:  # one JAX process over a device per stage
        env = _with_host_devices(config.pipeline_stages)
    elif config.devices > 1 and framework == "torch":
        processes = config.devices  # one DDP process per device
    elif config.devices > 1:  # JAX: ``processes`` over jax.distributed; on a CPU host, XLA gives each its devices
        processes, launcher = config.processes, "jax.distributed"
        env = _with_host_devices(config.devices // config.processes)
    if cache_dir is not None:
        env = {**(env if env is not None else os.environ), COMPILE_CACHE: cache_dir}
    row = run_isolated("train", {"framework": framework, "config": config.to_dict()}, timeout_s=timeout_s,
                       env=env, processes=processes, launcher=launcher)
    return result_of(framework, row)


def result_of(framework: str, row: dict[str, Any]) -> RunResult:
    """The worker's JSON as a RunResult; a job that failed before the trainer answered (a crash, a timeout, an
    error raised in the worker) is ``RunResult.failed`` with its error."""
    if "framework" not in row:
        return RunResult.failed(framework, str(row.get("error", "no result")), status=row.get("status", "failed"),
                                traceback=row.get("traceback"))
    return RunResult.from_row(row)
