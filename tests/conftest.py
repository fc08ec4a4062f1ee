"""Shared fixtures: small data sets written in the real on-disk formats.

The suite shares one JAX persistent compilation cache, and one torch inductor cache, across its processes (set
here, before JAX is imported, and inherited by every isolated run): the same small models are compiled again and
again, op by op most of all (a tiny JAX eager run: 12.5 s cold, 5.5 s warm). No test reads compile times; the
driver itself leaves both off, so its first-step times are real compilations."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="twinrun-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The same for torch.compile's inductor cache in the driver's isolated runs (each would otherwise compile, and
# build its C++ kernels, from scratch: ~20 s a run here).
if "TWINRUN_SHARED_INDUCTOR_CACHE" not in os.environ:
    os.environ["TWINRUN_SHARED_INDUCTOR_CACHE"] = tempfile.mkdtemp(prefix="twinrun-test-inductor-cache-")
    atexit.register(shutil.rmtree, os.environ["TWINRUN_SHARED_INDUCTOR_CACHE"], ignore_errors=True)
# ... and for the tests that compile in their own process: otherwise torch's default cache in /tmp, kept between
# suites on one machine, made them warm here and cold on CI (a trainer test: 13 s warm, 107 s cold)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.environ["TWINRUN_SHARED_INDUCTOR_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Under pytest-xdist (`make test`: 2 workers on 2 cores) each worker, and every run it starts, takes one OpenMP
# thread: two processes of 2 spinning threads each on 2 cores thrash (a time-to-accuracy ladder took 416 s beside
# another worker, 79 s alone; tests/test_text_inference.py saw 40 s instead of 2 s). Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest

from experiments.catalog.fixtures import write_cifar_archive


@pytest.fixture(scope="session")
def cifar100_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar_archive(tmp_path_factory.mktemp("cifar100"), kind="cifar100", n_train=600, n_test=200, seed=1)


@pytest.fixture(scope="session")
def cifar10_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar_archive(tmp_path_factory.mktemp("cifar10"), kind="cifar10", n_train=500, n_test=100, seed=2)


@pytest.fixture(scope="session")
def text_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """AG News's CSV layout, 4 classes, long-tailed lengths (experiments/catalog/fixtures.py): 320 train, 64 test
    texts."""
    from experiments.catalog.fixtures import write_text_fixture

    return write_text_fixture(tmp_path_factory.mktemp("agnews"), fmt="agnews", n_train=320, n_test=64, seed=3)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test`` runs on 2 xdist workers with ``--dist worksteal``, which hands each worker one contiguous half
    of this list and lets an idle worker take from the end of the other's queue. So each half starts with its share
    of the slow tests, dealt alternately (the end-to-end ones, the longest, first: the tiny gpu_check.sh takes
    minutes), and ends with fast ones to be taken: a worker that drew a long test at the end would leave the other
    idle meanwhile. Without xdist the order changes nothing (the tests are independent). This order interleaves the
    modules, and pytest tears a module's fixtures down whenever the next test is in another module: so the
    expensive fixtures are session-scoped (a module-scoped one, the inference tests' trained ResNet, was built 3
    times in one suite run), and those worth sharing between the workers are built once (helpers.built_once)."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    slow.sort(key=lambda item: item.get_closest_marker("e2e") is None)  # stable: collection order within each
    fast = [item for item in items if not item.get_closest_marker("slow")]
    first, second = slow[0::2], slow[1::2]
    split = max(0, len(items) // 2 - len(first))
    items[:] = first + fast[:split] + second + fast[split:]
