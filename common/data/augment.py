"""Deterministic training augmentation in numpy: the ones a data source allows (``Source.augmentations``).

Every random choice is a function of (seed, epoch, index) only, never of a worker's RNG state, so any
loader, any worker count and either framework produce bit-identical samples.
"""

from __future__ import annotations

import numpy as np

from common.errors import DataError

PAD = 4
# What a source may allow, in the order they apply: a pad-4 random crop (zero padding, as torchvision's RandomCrop)
# and a horizontal flip (CIFAR's recipe; a flipped digit is no digit)
AUGMENTATIONS = ("crop", "flip")

# Per-channel statistics of the real training sets (the usual published values), used for normalisation.
CHANNEL_STATS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "synthetic": ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
    "mnist5k": ((0.1004, 0.1004, 0.1004), (0.2754, 0.2754, 0.2754)),  # measured on the padded train split
}


def channel_stats(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    key = dataset.split(":")[-1]
    mean, std = CHANNEL_STATS.get(key, CHANNEL_STATS["synthetic"])
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def check_augmentations(names: tuple[str, ...], source: str) -> None:
    unknown = [name for name in names if name not in AUGMENTATIONS]
    if unknown:
        raise DataError(f"source '{source}' asks for augmentation {unknown[0]!r}; known: {', '.join(AUGMENTATIONS)}")


def crop_and_flip(seed: int, epoch: int, index: int) -> tuple[int, int, bool]:
    """The random choices for one sample: top, left offset into the padded image, and horizontal flip."""
    rng = np.random.default_rng((seed, epoch, index))
    top, left = rng.integers(0, 2 * PAD + 1, size=2)
    flip = bool(rng.integers(0, 2))
    return int(top), int(left), flip


def normalise(image: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return ((image.astype(np.float32) / np.float32(255.0)) - mean) / std


def train_transform(
    image: np.ndarray, seed: int, epoch: int, index: int, mean: np.ndarray, std: np.ndarray,
    augmentations: tuple[str, ...],
) -> np.ndarray:
    """The ``augmentations`` the source allows (of AUGMENTATIONS), then normalise; HWC float32. The random choices
    are drawn alike whichever apply, so a crop lands where it would with the flip too."""
    height, width = image.shape[:2]
    top, left, flip = crop_and_flip(seed, epoch, index)
    out = image
    if "crop" in augmentations:
        out = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)))[top : top + height, left : left + width]
    if flip and "flip" in augmentations:
        out = out[:, ::-1]
    return normalise(out, mean, std)


def eval_transform(image: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return normalise(image, mean, std)
