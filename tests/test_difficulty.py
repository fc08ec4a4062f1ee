"""The generator's difficulty knob: harder is measurably harder, difficulty 0 is the original archive byte for
byte, and archives of different difficulties never share a folder."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from common.data.cifar import LAYOUTS, read_cifar
from common.errors import DataError
from experiments.catalog.defaults import LADDER_DIFFICULTY, archive_folder, default_archive
from experiments.catalog.fixtures import hardness, write_cifar_archive

# Computed from the generator as it was before the difficulty knob (commit 33a777b), over the decoded images,
# labels and class names of both splits of the default archive (cifar100, 5000 / 1000, seed 0): results stored
# against that archive stay comparable only while this holds.
ORIGINAL_DEFAULT_DIGEST = "bb549316743cccd5c64921bccd920e3e980269afb2540998c6aca8b2e613ad34"


def _content_digest(archive: Path, kind: str) -> str:
    """Digest of what a reader gets (not of the .tar.gz, whose headers carry the time of writing)."""
    digest = hashlib.sha256()
    for split in ("train", "test"):
        images, labels, names = read_cifar(archive, kind, split)
        digest.update(np.ascontiguousarray(images, np.uint8).tobytes())
        digest.update(np.asarray(labels, "<i8").tobytes())
        digest.update("\n".join(names).encode())
    return digest.hexdigest()


def _nearest_class_mean_accuracy(archive: Path, kind: str) -> float:
    """Test accuracy of per-class pixel means fitted on the train split: near optimal for prototype + noise data,
    so it falls only when the classes really overlap."""
    train, train_labels, _ = read_cifar(archive, kind, "train")
    test, test_labels, _ = read_cifar(archive, kind, "test")
    x = train.reshape(len(train), -1).astype(np.float32)
    means = np.stack([x[train_labels == c].mean(0) for c in range(LAYOUTS[kind].num_classes)])
    xt = test.reshape(len(test), -1).astype(np.float32)
    distances = (means**2).sum(1)[None] - 2 * xt @ means.T  # squared distance up to a per-image constant
    return float((distances.argmin(1) == test_labels).mean())


def test_default_archive_at_difficulty_zero_is_the_original(tmp_path):
    archive = default_archive("cifar100", root=tmp_path)
    assert archive.parent.name == "generated-cifar100-5000-1000"  # the folder existing archives already sit in
    assert _content_digest(archive, "cifar100") == ORIGINAL_DEFAULT_DIGEST


def test_higher_difficulty_overlaps_the_classes(tmp_path):
    accuracy = {
        d: _nearest_class_mean_accuracy(
            write_cifar_archive(tmp_path / f"d{d}", "cifar100", n_train=2000, n_test=500, seed=0, difficulty=d),
            "cifar100")
        for d in (0.0, 0.5, LADDER_DIFFICULTY)
    }
    assert accuracy[0.0] > 0.95  # the original set: the classes are far apart
    assert accuracy[0.0] > accuracy[0.5] > accuracy[LADDER_DIFFICULTY]
    assert accuracy[LADDER_DIFFICULTY] < accuracy[0.0] - 0.2  # measured: 1.0 vs 0.69
    assert accuracy[LADDER_DIFFICULTY] > 0.3  # harder, yet learnable (chance is 0.01)


def test_difficulty_is_deterministic_by_seed(tmp_path):
    def digest(name: str, seed: int) -> str:
        archive = write_cifar_archive(tmp_path / name, "cifar10", n_train=100, n_test=50, seed=seed, difficulty=0.7)
        return _content_digest(archive, "cifar10")

    assert digest("a", seed=4) == digest("b", seed=4)
    assert digest("c", seed=5) != digest("a", seed=4)


def test_difficulty_terms_stay_within_their_bounds():
    ladder = hardness(LADDER_DIFFICULTY)
    assert hardness(0.0) == hardness(-0.0)
    assert all(value == 0 for value in vars(hardness(0.0)).values())
    assert 0 < ladder.label_noise <= hardness(1.0).label_noise <= 0.05  # a few percent of labels at most
    assert hardness(1.0).distractor < 0.5  # an image always stays nearer its own class
    assert hardness(1.0).shared < 1.0  # sibling classes never become identical
    for bad in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(DataError, match="difficulty"):
            hardness(bad)


def test_each_difficulty_has_its_own_default_folder(tmp_path):
    difficulties = (0.0, 0.6, 0.6000001, LADDER_DIFFICULTY)
    folders = [archive_folder("cifar10", 50, 20, d) for d in difficulties]
    assert len(set(folders)) == len(folders)
    assert folders[0] == "generated-cifar10-50-20" and folders[1] == "generated-cifar10-50-20-d0.6"
    archives = [default_archive("cifar10", 50, 20, root=tmp_path, difficulty=d) for d in difficulties[:2]]
    assert [a.parent.name for a in archives] == folders[:2]
    assert _content_digest(archives[0], "cifar10") != _content_digest(archives[1], "cifar10")
    with pytest.raises(DataError, match="difficulty"):
        default_archive("cifar10", 50, 20, root=tmp_path, difficulty=2.0)
