"""Checkpoints with torch.save, written atomically (temporary file, then rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def checkpoint_path(folder: str | Path, step: int) -> Path:
    return Path(folder) / f"torch_step_{step:08d}.pt"


def save(folder: str | Path, step: int, state: dict[str, Any]) -> Path:
    path = checkpoint_path(folder, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": step, **state}, tmp)
    os.replace(tmp, path)
    return path


def latest(folder: str | Path) -> Path | None:
    candidates = sorted(Path(folder).glob("torch_step_*.pt"))
    return candidates[-1] if candidates else None


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=False)
