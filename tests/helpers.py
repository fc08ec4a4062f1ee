"""Helpers shared by the parallelism tests (imported as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
