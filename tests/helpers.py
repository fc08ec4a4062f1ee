"""Helpers shared by the parallelism tests (imported as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from common.config import RunConfig
from experiments.execution.paired import run_framework


def train(framework: str, config: RunConfig, path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One isolated run's per-step losses and its final weights (torch-keyed, saved to ``path``)."""
    result = run_framework(framework, config.replace(save_weights=str(path)))
    assert result.status == "ok", result.error
    weights = np.load(path)
    return np.asarray(result.losses), {k: weights[k] for k in weights.files}


def weight_gap(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """The largest absolute difference over every tensor of two weight sets with the same keys."""
    assert set(a) == set(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build`` fills once per test session, whichever xdist worker asks first: the other waits on its
    lock and reads it (a session fixture is otherwise built once in each worker: the inference tests' trained
    ResNet, 12-16 s, twice). Without xdist, a folder of this session's own."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent  # this session's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():  # a build that failed left no mark: the next asker builds again, and fails in turn
            folder.mkdir(exist_ok=True)
            build(folder)
            done.touch()
    return folder
