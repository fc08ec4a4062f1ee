"""Shared fixtures: small data sets written in the real on-disk formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.data.fixtures import write_cifar_archive


@pytest.fixture(scope="session")
def cifar100_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar_archive(tmp_path_factory.mktemp("cifar100"), kind="cifar100", n_train=600, n_test=200, seed=1)


@pytest.fixture(scope="session")
def cifar10_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar_archive(tmp_path_factory.mktemp("cifar10"), kind="cifar10", n_train=500, n_test=100, seed=2)
