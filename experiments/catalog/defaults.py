"""Embedded defaults: a generated CIFAR-100-format archive stands in when no data path is given."""

from __future__ import annotations

from pathlib import Path

from common.config import RunConfig
from common.data.cifar import LAYOUTS
from common.data.fixtures import write_cifar_archive

DEFAULT_DATA_ROOT = Path("data")


def with_default_data(config: RunConfig) -> RunConfig:
    """``config`` reading the generated archive of its kind when it names no data (CIFAR sources only)."""
    if config.data is None and config.source in LAYOUTS:
        return config.replace(data=str(default_archive(config.source)))
    return config


def default_archive(kind: str = "cifar100", n_train: int = 5000, n_test: int = 1000,
                    root: Path = DEFAULT_DATA_ROOT) -> Path:
    """Path to a generated ``kind`` archive in the official format (made once, then reused)."""
    folder = root / f"generated-{kind}-{n_train}-{n_test}"
    archive = folder / LAYOUTS[kind].archive_name
    if not archive.exists():
        write_cifar_archive(archive, kind=kind, n_train=n_train, n_test=n_test, seed=0)
    return archive
