"""Checkpoints with orbax-checkpoint (it writes to a temporary folder and renames: atomic), and the state they hold:
``TrainState``, what JAX's step threads from call to call (torch's objects keep theirs: the model, optimizer,
scheduler and GradScaler that torch_impl/backend.py saves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from common.errors import ConfigError
from jax_impl.amp import LossScale


class TrainState(NamedTuple):
    params: Any
    batch_stats: Any
    opt_state: Any
    loss_scale: LossScale


def checkpoint_path(folder: str | Path, step: int) -> Path:
    return Path(folder).absolute() / f"jax_step_{step:08d}"


def save(folder: str | Path, step: int, state: Any) -> Path:
    path = checkpoint_path(folder, step)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    return path


def latest(folder: str | Path) -> Path | None:
    candidates = sorted(p for p in Path(folder).absolute().glob("jax_step_*") if p.is_dir() and "tmp" not in p.name)
    return candidates[-1] if candidates else None


def load(path: Path, like: Any) -> Any:
    """Restores into the structure, shapes and dtypes of ``like``; a checkpoint of another state (another model, or
    one written before the state changed shape: the loss scale's growth interval joined it) is a ConfigError that
    names it, not orbax's bare ValueError."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
        return ocp.StandardCheckpointer().restore(path, abstract)
    except ValueError as error:
        if "do not match" not in str(error):
            raise
        raise ConfigError(f"checkpoint {path} does not hold this run's state (another model or settings, or an older "
                          f"twinrun wrote it): {' '.join(str(error).split())[:300]}; resume from a checkpoint of this "
                          "run, or start without --resume") from None


def step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[1])
