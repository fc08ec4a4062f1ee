"""Checks a run's config against this machine and the file system before the first run starts, each refusal one
named line (a ConfigError: exit 2): combinations the trainers refuse only once they run (after minutes, sometimes,
and as a raw exception in a failed row), and paths that cannot be what they are given as.

RunConfig's own validation (common/config.py) needs nothing but the config; these need the frameworks chosen, the
device or the files named."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from common.config import RunConfig
from common.errors import ConfigError


def torch_processes(config: RunConfig) -> int:
    """How many processes a torch run of ``config`` starts (one per data-parallel replica or pipeline stage)."""
    return config.devices * config.pipeline_stages


def check_runnable(config: RunConfig, frameworks: tuple[str, ...]) -> None:
    """Refuses, by name, what would fail in every run of ``config`` with ``frameworks``."""
    if "torch" in frameworks:
        _check_torch(config)
    if config.init_weights:
        check_weights_file(config.init_weights, "--init-weights")
    for flag, path in (("--checkpoint-dir", config.checkpoint_dir), ("--profile-dir", config.profile_dir),
                       ("--tensorboard-dir", config.tensorboard_dir)):
        if path:
            _check_folder(Path(path), flag)


def _check_torch(config: RunConfig) -> None:
    processes = torch_processes(config)
    if config.target_accuracy is not None and processes > 1:
        raise ConfigError(f"--to-accuracy over {processes} torch processes (--devices/--processes "
                          f"{config.devices}) is not built: only rank 0 evaluates, and the other ranks could not be "
                          f"told to stop; give --framework jax, or one device")
    if config.sync_bn:
        from experiments.execution.device import cuda_available  # imports torch: only when it matters

        if not cuda_available():
            raise ConfigError("--sync-bn: torch's SyncBatchNorm runs on CUDA GPUs only (it raises on CPU tensors) "
                              "and there is none here; give --framework jax (its axis_name BatchNorm runs on a CPU)")


def check_weights_file(path: str | Path, flag: str) -> None:
    """``path`` must be a weights file: a numpy .npz archive of arrays (torch-keyed, as twinrun writes them)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such file")
    if not path.is_file():
        raise ConfigError(f"{flag} {path} is a folder, not a weights file (.npz)")
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{flag} {path} is not a weights file: expected a numpy .npz archive of arrays (torch "
                          f"state_dict keys), as --save-weights writes")
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{flag} {path} is not a readable .npz archive ({exc})") from None
    if not names:
        raise ConfigError(f"{flag} {path} holds no arrays")


def _check_folder(path: Path, flag: str) -> None:
    """A folder a run writes into: it may not exist yet, but neither it nor a parent may be a file."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"{flag} {path}: {blocking} is a file, so no folder can be made there")
