"""Embedded defaults: a generated CIFAR-100-format archive stands in when no data path is given."""

from __future__ import annotations

from pathlib import Path

from common.config import RunConfig
from common.data.cifar import LAYOUTS
from experiments.catalog.fixtures import write_cifar_archive, write_text_fixture

DEFAULT_DATA_ROOT = Path("data")

# The generator's difficulty for measuring time to accuracy. Calibrated with the cpu preset's model (torch eager, SGD
# 0.05, cosine over 5 epochs) on the default-sized archive: 0.07, 0.28, 0.41, 0.61, 0.63 after epochs 1..5 (seed 1:
# 0.03 .. 0.62); over 10 epochs it levels off near 0.81. Difficulty 0 is at 1.0 after 3 epochs.
LADDER_DIFFICULTY = 0.85


def with_default_data(config: RunConfig) -> RunConfig:
    """``config`` reading the generated data of its kind when it names none (a CIFAR archive, or AG News CSVs)."""
    if config.data is None and config.source in LAYOUTS:
        return config.replace(data=str(default_archive(config.source)))
    if config.data is None and config.source == "text":
        return config.replace(data=str(default_text_folder()))
    return config


def default_text_folder(n_train: int = 2000, n_test: int = 500, root: Path = DEFAULT_DATA_ROOT) -> Path:
    """A generated text set in AG News's CSV layout (4 classes, long-tailed lengths; made once, then reused)."""
    folder = root / f"generated-agnews-{n_train}-{n_test}"
    if not (folder / "test.csv").exists():  # written last: a folder without it was interrupted
        write_text_fixture(folder, fmt="agnews", n_train=n_train, n_test=n_test, seed=0)
    return folder


def archive_folder(kind: str, n_train: int, n_test: int, difficulty: float = 0.0) -> str:
    """The folder name of a generated archive: every setting that changes its bytes is in it, so two never mix.

    Difficulty 0 keeps the original name (archives already generated, and results that name them, stay valid);
    any other is appended by ``repr``, the shortest text that reads back as the same float.
    """
    name = f"generated-{kind}-{n_train}-{n_test}"
    return name if difficulty == 0.0 else f"{name}-d{float(difficulty)!r}"


def default_archive(kind: str = "cifar100", n_train: int = 5000, n_test: int = 1000,
                    root: Path = DEFAULT_DATA_ROOT, difficulty: float = 0.0) -> Path:
    """Path to a generated ``kind`` archive in the official format (made once, then reused)."""
    archive = root / archive_folder(kind, n_train, n_test, difficulty) / LAYOUTS[kind].archive_name
    if not archive.exists():
        write_cifar_archive(archive, kind=kind, n_train=n_train, n_test=n_test, seed=0, difficulty=difficulty)
    return archive
