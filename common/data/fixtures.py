"""Small CIFAR data sets written in exactly the official archive format, for tests and the CPU demo.

Each class has its own coarse colour pattern (a random 4x4x3 grid blown up to 32x32) and every image is
that pattern plus noise and a brightness shift, so a small network learns it within a few epochs while
chance stays at 1/num_classes. The tar layout, pickle keys and dtypes are the published ones, so the
real reader (and torchvision) read these files unchanged.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import numpy as np

from common.data.cifar import LAYOUTS, pickle_bytes
from common.errors import DataError


def _class_images(rng: np.random.Generator, labels: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    base = prototypes[labels].astype(np.float32)  # N x 32 x 32 x 3
    noise = rng.normal(0.0, 28.0, size=base.shape).astype(np.float32)
    brightness = rng.normal(0.0, 12.0, size=(len(labels), 1, 1, 1)).astype(np.float32)
    return np.clip(base + noise + brightness, 0, 255).astype(np.uint8)


def _to_rows(images: np.ndarray) -> np.ndarray:
    """N x 32 x 32 x 3 -> N x 3072 as R, G, B planes, the published row layout."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def _split(rng: np.random.Generator, n: int, num_classes: int, prototypes: np.ndarray) -> tuple[np.ndarray, list[int]]:
    labels = np.arange(n) % num_classes  # balanced classes
    rng.shuffle(labels)
    return _to_rows(_class_images(rng, labels, prototypes)), [int(x) for x in labels]


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(payload))


def write_cifar_archive(
    path: str | Path, kind: str = "cifar100", n_train: int = 5000, n_test: int = 1000, seed: int = 0
) -> Path:
    """Writes ``kind`` (cifar100 or cifar10) as the official ``*-python.tar.gz``; returns the archive path.

    ``path`` is either the archive file to write or a folder to write it into under its official name.
    """
    if kind not in LAYOUTS:
        raise DataError(f"unknown CIFAR kind '{kind}'; known: {', '.join(LAYOUTS)}")
    if n_train <= 0 or n_test <= 0:
        raise DataError(f"n_train and n_test must be positive, got {n_train} and {n_test}")
    layout = LAYOUTS[kind]
    path = Path(path)
    archive = path if path.name.endswith((".tar.gz", ".tgz")) else path / layout.archive_name
    archive.parent.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)
    grid = rng.integers(30, 226, size=(layout.num_classes, 4, 4, 3)).astype(np.uint8)
    prototypes = grid.repeat(8, axis=1).repeat(8, axis=2)
    train_rows, train_labels = _split(rng, n_train, layout.num_classes, prototypes)
    test_rows, test_labels = _split(rng, n_test, layout.num_classes, prototypes)
    class_names = [f"class_{i:03d}" for i in range(layout.num_classes)]

    files: list[tuple[str, dict]] = []
    if kind == "cifar100":
        coarse = lambda labels: [y // 5 for y in labels]  # noqa: E731 - 20 super-classes of 5, as published
        for name, rows, labels in (("train", train_rows, train_labels), ("test", test_rows, test_labels)):
            files.append((name, {
                "filenames": [f"{name}_{i:06d}.png" for i in range(len(labels))],
                "batch_label": f"{name}ing batch 1 of 1",
                "fine_labels": labels,
                "coarse_labels": coarse(labels),
                "data": rows,
            }))
        files.append(("meta", {
            "fine_label_names": class_names,
            "coarse_label_names": [f"superclass_{i:02d}" for i in range(20)],
        }))
    else:
        chunks = np.array_split(np.arange(n_train), len(layout.train_files))
        for number, (name, chunk) in enumerate(zip(layout.train_files, chunks, strict=True), start=1):
            files.append((name, {
                "batch_label": f"training batch {number} of 5",
                "labels": [train_labels[i] for i in chunk],
                "data": train_rows[chunk],
                "filenames": [f"train_{i:06d}.png" for i in chunk],
            }))
        files.append(("test_batch", {
            "batch_label": "testing batch 1 of 1",
            "labels": test_labels,
            "data": test_rows,
            "filenames": [f"test_{i:06d}.png" for i in range(n_test)],
        }))
        files.append(("batches.meta", {"label_names": class_names, "num_cases_per_batch": 10000, "num_vis": 3072}))

    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        folder = tarfile.TarInfo(layout.folder)
        folder.type = tarfile.DIRTYPE
        folder.mode = 0o755
        tar.addfile(folder)
        for name, content in files:
            _add(tar, f"{layout.folder}/{name}", pickle_bytes(content))
    os.replace(tmp, archive)
    return archive
