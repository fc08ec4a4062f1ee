"""Reader for the official CIFAR-10/100 "python version" archives, exactly as published.

The archive (``cifar-100-python.tar.gz`` / ``cifar-10-python.tar.gz``) or its extracted folder is read
unchanged: pickled dicts whose ``data`` is an (N, 3072) uint8 array laid out as R, G, B planes of 32x32.
This is the layout torchvision's ``CIFAR10``/``CIFAR100`` read, so both see the same images and labels.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import DataError


@dataclass(frozen=True)
class CifarLayout:
    """Where each split lives inside the archive and which pickle keys hold the labels."""

    kind: str
    folder: str
    archive_name: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    label_names_key: str
    num_classes: int


LAYOUTS: dict[str, CifarLayout] = {
    "cifar100": CifarLayout(
        kind="cifar100",
        folder="cifar-100-python",
        archive_name="cifar-100-python.tar.gz",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        label_key="fine_labels",
        label_names_key="fine_label_names",
        num_classes=100,
    ),
    "cifar10": CifarLayout(
        kind="cifar10",
        folder="cifar-10-batches-py",
        archive_name="cifar-10-python.tar.gz",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        label_key="labels",
        label_names_key="label_names",
        num_classes=10,
    ),
}

def expected_layout_text(layout: CifarLayout) -> str:
    files = ", ".join(layout.train_files + layout.test_files + (layout.meta_file,))
    return (
        f"the official archive '{layout.archive_name}', or the folder '{layout.folder}/' "
        f"(or a folder containing it) holding {files}"
    )


def _unpickle(raw: bytes, where: str) -> dict[str, Any]:
    try:
        # The published files were pickled by Python 2; latin1 is how torchvision decodes them too.
        obj = pickle.loads(raw, encoding="latin1")
    except Exception as exc:  # pickle raises many types on corrupt input
        raise DataError(f"corrupt CIFAR file {where}: cannot unpickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"corrupt CIFAR file {where}: expected a pickled dict, found {type(obj).__name__}")
    return obj


class _FolderReader:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def read(self, name: str) -> bytes:
        path = self.folder / name
        if not path.is_file():
            raise FileNotFoundError(str(path))
        return path.read_bytes()


class _TarReader:
    def __init__(self, archive: Path, folder: str) -> None:
        self.archive = archive
        self.folder = folder
        try:
            with tarfile.open(archive, "r:*") as tar:
                self._members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
                _read_to_the_end(tar.fileobj)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            reason = " ".join(str(exc).split())  # tarfile lists each method it tried on a line of its own
            raise DataError(f"corrupt or truncated CIFAR archive {archive}: {type(exc).__name__}: {reason}") from None

    def read(self, name: str) -> bytes:
        key = f"{self.folder}/{name}"
        if key not in self._members:
            raise FileNotFoundError(f"{self.archive}:{key}")
        return self._members[key]


def _read_to_the_end(stream: Any) -> None:
    """Reads what is left of a compressed archive, so that gzip checks its CRC and length: tarfile stops quietly at
    the first header it cannot read, which a damaged stream makes look like the end of a short archive (and a
    member that "is missing")."""
    while stream is not None and stream.read(1 << 20):
        pass


def _open_reader(path: Path, layout: CifarLayout) -> _FolderReader | _TarReader:
    if not path.exists():
        raise DataError(f"CIFAR data not found at {path}: expected {expected_layout_text(layout)}")
    if path.is_file():
        return _TarReader(path, layout.folder)
    if (path / layout.folder).is_dir():
        return _FolderReader(path / layout.folder)
    if (path / layout.archive_name).is_file():
        return _TarReader(path / layout.archive_name, layout.folder)
    if (path / layout.meta_file).is_file():
        return _FolderReader(path)
    raise DataError(f"no {layout.kind} data in {path}: expected {expected_layout_text(layout)}")


def read_cifar(path: str | Path, kind: str, split: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Returns (images uint8 NxHxWx3, labels int64 N, class names) for ``split`` ('train' or 'test')."""
    if kind not in LAYOUTS:
        raise DataError(f"unknown CIFAR kind '{kind}'; known: {', '.join(LAYOUTS)}")
    if split not in ("train", "test"):
        raise DataError(f"unknown split '{split}' for {kind}; known: train, test")
    layout = LAYOUTS[kind]
    reader = _open_reader(Path(path), layout)
    names = layout.train_files if split == "train" else layout.test_files
    images, labels = [], []
    for name in (*names, layout.meta_file):
        try:
            reader.read(name)
        except FileNotFoundError as missing:
            raise DataError(
                f"{kind} data at {path} is incomplete: {missing} is missing; expected {expected_layout_text(layout)}"
            ) from None
    meta = _unpickle(reader.read(layout.meta_file), f"{path}:{layout.meta_file}")
    class_names = list(meta.get(layout.label_names_key, []))
    for name in names:
        where = f"{path}:{name}"
        entry = _unpickle(reader.read(name), where)
        if "data" not in entry or layout.label_key not in entry:
            raise DataError(f"corrupt CIFAR file {where}: keys 'data' and '{layout.label_key}' are required")
        data = np.asarray(entry["data"])
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise DataError(f"corrupt CIFAR file {where}: 'data' must be uint8 (N, 3072), found {data.dtype} "
                            f"{data.shape}")
        split_labels = np.asarray(entry[layout.label_key], dtype=np.int64)
        if split_labels.shape != (data.shape[0],):
            raise DataError(f"corrupt CIFAR file {where}: {len(split_labels)} labels for {data.shape[0]} images")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(split_labels)
    all_labels = np.concatenate(labels)
    bad = (all_labels < 0) | (all_labels >= layout.num_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{kind} data at {path}: label {int(all_labels[first])} at index {first} is outside "
            f"0..{layout.num_classes - 1}"
        )
    return np.ascontiguousarray(np.concatenate(images)), all_labels, class_names


def pickle_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=2)
    return buf.getvalue()
