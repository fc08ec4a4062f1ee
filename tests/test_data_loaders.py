"""One data set, two loaders: the torch DataLoader and the grain pipeline yield bit-identical batches."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import RunConfig
from common.data import EpochSampler, load_source
from common.data.augment import channel_stats, train_transform
from common.workloads import loader_options


def _torch_batches(source, options, epoch):
    from torch_impl.data import make_loader

    loader = make_loader(source, options, train=True)
    return [(x.permute(0, 2, 3, 1).numpy(), y.numpy()) for x, y in loader.epoch(epoch)]


def _jax_batches(source, options, epoch):
    from jax_impl.data import make_loader

    return [(np.asarray(x), np.asarray(y)) for x, y in make_loader(source, options, train=True).epoch(epoch)]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2 workers each side: 12.8 s
def test_torch_and_jax_loaders_yield_identical_batches(cifar100_archive, workers):
    source = load_source("cifar100", "train", cifar100_archive)
    options = loader_options(RunConfig(batch_size=128, workers=workers, seed=11, device_prefetch=2), train=True)
    torch_batches = _torch_batches(source, options, epoch=3)
    jax_batches = _jax_batches(source, options, epoch=3)
    assert len(torch_batches) == len(jax_batches) == 5  # 600 samples: 4 full batches and a short one
    assert torch_batches[-1][0].shape == (600 - 4 * 128, 32, 32, 3)
    for (tx, ty), (jx, jy) in zip(torch_batches, jax_batches, strict=True):
        assert tx.dtype == jx.dtype == np.float32
        np.testing.assert_array_equal(tx, jx)
        np.testing.assert_array_equal(ty, jy)


def test_epochs_differ_and_drop_last_drops_the_short_batch(cifar100_archive):
    source = load_source("cifar100", "train", cifar100_archive)
    options = loader_options(RunConfig(batch_size=128, seed=11, drop_last=True), train=True)
    epoch0 = _jax_batches(source, options, 0)
    epoch1 = _jax_batches(source, options, 1)
    assert len(epoch0) == 4 and all(x.shape[0] == 128 for x, _ in epoch0)
    assert not np.array_equal(epoch0[0][1], epoch1[0][1])


def test_augmentation_is_a_function_of_seed_epoch_index_only():
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    mean, std = channel_stats("cifar100")
    a = train_transform(image, 1, 2, 3, mean, std, ("crop", "flip"))
    np.testing.assert_array_equal(a, train_transform(image, 1, 2, 3, mean, std, ("crop", "flip")))
    variants = [train_transform(image, 1, epoch, 3, mean, std, ("crop", "flip")) for epoch in range(8)]
    assert any(not np.array_equal(a, v) for v in variants[3:])
    assert a.shape == (32, 32, 3) and a.dtype == np.float32


@pytest.mark.parametrize("n,batch,world", [(600, 32, 2), (601, 16, 4), (10, 3, 3)])
def test_shards_are_disjoint_cover_the_epoch_and_slice_the_global_batch(n, batch, world):
    single = EpochSampler(n, batch * world, seed=5)
    shards = [EpochSampler(n, batch, seed=5, rank=r, world_size=world) for r in range(world)]
    per_rank = [s.indices(epoch=2) for s in shards]
    together = np.concatenate(per_rank)
    assert len(together) == n and len(np.unique(together)) == n  # disjoint and covering
    for step, global_batch in enumerate(single.batches(2)):
        pieces = [s.batches(2)[step] for s in shards if step < len(s.batches(2))]
        np.testing.assert_array_equal(np.concatenate(pieces), global_batch)
