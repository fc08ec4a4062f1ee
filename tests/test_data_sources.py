"""The official archive format: our reader and torchvision's read the same images and labels."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torchvision

from common.data import load_source
from common.data.cifar import LAYOUTS


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _torchvision_dataset(archive: Path, kind: str, train: bool, root: Path):
    """torchvision's own class, reading our files unchanged; only the published checksums are swapped
    for those of the fixture files (its integrity check would otherwise reject any other data)."""
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    layout = LAYOUTS[kind]
    folder = root / layout.folder
    base = torchvision.datasets.CIFAR100 if kind == "cifar100" else torchvision.datasets.CIFAR10

    class FixtureCifar(base):  # type: ignore[misc, valid-type]
        train_list = [[name, _md5(folder / name)] for name in layout.train_files]
        test_list = [[name, _md5(folder / name)] for name in layout.test_files]
        meta = {"filename": layout.meta_file, "key": layout.label_names_key, "md5": _md5(folder / layout.meta_file)}

    return FixtureCifar(str(root), train=train, download=False)


@pytest.mark.parametrize("kind", ["cifar100", "cifar10"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_fixture_archive_reads_identically_in_torchvision(kind, split, request, tmp_path):
    archive = request.getfixturevalue(f"{kind}_archive")
    ours = load_source(kind, split, archive)
    theirs = _torchvision_dataset(archive, kind, split == "train", tmp_path)
    assert len(ours) == len(theirs) > 0
    assert ours.num_classes == LAYOUTS[kind].num_classes
    for i in range(len(ours)):
        image, label = ours[i]
        their_image, their_label = theirs[i]
        assert label == their_label
        np.testing.assert_array_equal(image, np.asarray(their_image))


def test_extracted_folder_reads_like_archive(cifar100_archive, tmp_path):
    with tarfile.open(cifar100_archive) as tar:
        tar.extractall(tmp_path, filter="data")
    from_archive = load_source("cifar100", "test", cifar100_archive)
    for path in (tmp_path, tmp_path / "cifar-100-python"):
        from_folder = load_source("cifar100", "test", path)
        np.testing.assert_array_equal(from_folder.images, from_archive.images)
        np.testing.assert_array_equal(from_folder.labels, from_archive.labels)


def test_png_source_decodes_to_the_same_pixels(cifar100_archive):
    raw = load_source("cifar100", "test", cifar100_archive)
    png = load_source("cifar100", "test", cifar100_archive, png=True)
    assert png.name == "cifar100+png" and len(png) == len(raw)
    assert isinstance(png.encoded[0], bytes) and png.encoded[0][:4] == b"\x89PNG"
    for i in (0, 7, len(raw) - 1):
        np.testing.assert_array_equal(png[i][0], raw[i][0])
        assert png[i][1] == raw[i][1]


def test_synthetic_is_deterministic_and_flagged():
    a = load_source("synthetic", "train", size=50, num_classes=10, seed=3)
    b = load_source("synthetic", "train", size=50, num_classes=10, seed=3)
    other_split = load_source("synthetic", "test", size=50, num_classes=10, seed=3)
    assert a.synthetic and len(a) == 50
    np.testing.assert_array_equal(a[5][0], b[5][0])
    assert not np.array_equal(a[5][0], other_split[5][0])
    assert a[5][0].dtype == np.uint8 and a[5][0].shape == (32, 32, 3)
    assert all(0 <= a[i][1] < 10 for i in range(50))


def test_fixture_has_learnable_class_structure(cifar100_archive):
    """A nearest-class-mean classifier far above chance shows the classes are separable."""
    train = load_source("cifar100", "train", cifar100_archive)
    test = load_source("cifar100", "test", cifar100_archive)
    x = train.images.reshape(len(train), -1).astype(np.float32)
    means = np.stack([x[train.labels == c].mean(0) for c in range(100)])
    xt = test.images.reshape(len(test), -1).astype(np.float32)
    predictions = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predictions == test.labels).mean() > 0.5  # chance is 0.01
