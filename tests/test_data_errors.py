"""Bad data input gets a clear error that names the problem."""

from __future__ import annotations

import io
import pickle
import tarfile

import numpy as np
import pytest

from common.config import RunConfig
from common.data import DataError, EpochSampler, load_source
from common.errors import ConfigError


def _write_tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_missing_path_names_path_and_layout(tmp_path):
    missing = tmp_path / "nowhere" / "cifar-100-python.tar.gz"
    with pytest.raises(DataError, match=r"nowhere.*cifar-100-python\.tar\.gz.*fine_label_names|nowhere.*expected"):
        load_source("cifar100", "train", missing)


def test_folder_without_data_says_what_is_expected(tmp_path):
    with pytest.raises(DataError, match="expected .*cifar-100-python"):
        load_source("cifar100", "train", tmp_path)


def test_truncated_archive(cifar100_archive, tmp_path):
    truncated = tmp_path / "cifar-100-python.tar.gz"
    truncated.write_bytes(cifar100_archive.read_bytes()[: 20000])
    with pytest.raises(DataError, match="corrupt or truncated"):
        load_source("cifar100", "train", truncated)


def test_corrupt_pickle_inside_a_valid_archive(tmp_path):
    archive = _write_tar(tmp_path / "x.tar.gz", {
        "cifar-100-python/train": b"not a pickle at all",
        "cifar-100-python/test": b"x",
        "cifar-100-python/meta": pickle.dumps({"fine_label_names": []}),
    })
    with pytest.raises(DataError, match="corrupt CIFAR file .*train.*unpickle"):
        load_source("cifar100", "train", archive)


def test_labels_outside_the_class_range(tmp_path):
    data = np.zeros((4, 3072), np.uint8)
    entry = {"data": data, "fine_labels": [0, 1, 100, 2]}
    archive = _write_tar(tmp_path / "x.tar.gz", {
        "cifar-100-python/train": pickle.dumps(entry),
        "cifar-100-python/test": pickle.dumps(entry),
        "cifar-100-python/meta": pickle.dumps({"fine_label_names": []}),
    })
    with pytest.raises(DataError, match="label 100 at index 2 is outside 0..99"):
        load_source("cifar100", "train", archive)


def test_missing_member(tmp_path):
    archive = _write_tar(tmp_path / "x.tar.gz", {"cifar-100-python/meta": pickle.dumps({})})
    with pytest.raises(DataError, match="incomplete.*train is missing"):
        load_source("cifar100", "train", archive)


def test_unknown_source_lists_known_ones():
    with pytest.raises(DataError, match="unknown data source 'imagenet'; known: cifar100, cifar10"):
        load_source("imagenet", "train")


def test_unknown_split_and_option():
    with pytest.raises(DataError, match="unknown split 'val'"):
        load_source("synthetic", "val")
    with pytest.raises(DataError, match="takes no option"):
        load_source("synthetic", "train", colour=True)


def test_tfds_absent_or_unprepared_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="tensorflow-datasets|not prepared"):
        load_source("tfds:cifar100", "train", tmp_path)


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"workers": -1}, "workers must be 0 or more"),
    ({"prefetch": 0}, "prefetch must be positive"),
])
def test_bad_loader_options(kwargs, message):
    """The loader's knobs are RunConfig's and checked there (LoaderOptions is built from a checked config)."""
    with pytest.raises(ConfigError, match=message):
        RunConfig(**kwargs)


def test_bad_sampler_arguments():
    with pytest.raises(DataError, match="batch size must be positive"):
        EpochSampler(10, -2)
    with pytest.raises(DataError, match="rank 2 is not valid"):
        EpochSampler(10, 2, rank=2, world_size=2)
    with pytest.raises(DataError, match="leaves no batch"):
        EpochSampler(10, 16, drop_last=True)
