"""Batch assembly shared by both loaders: the same function turns index arrays into arrays."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from common.data.augment import channel_stats, check_augmentations, eval_transform, train_transform
from common.data.loader_options import LoaderOptions
from common.data.sampler import EpochSampler, LengthBucketSampler
from common.data.sources import Source


@dataclass
class BatchMaker:
    """Turns (epoch, indices) into an NHWC float32 image batch and int32 labels, identically everywhere; training
    images get the augmentations their source allows."""

    source: Source
    train: bool
    seed: int = 0
    read_latency_ms: float = 0.0  # simulated storage latency per batch: what loader workers exist to hide
    mean: np.ndarray = field(init=False)
    std: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mean, self.std = channel_stats(self.source.name.split("+")[0])
        check_augmentations(self.source.augmentations, self.source.name)

    def sample(self, epoch: int, index: int) -> tuple[np.ndarray, int]:
        image, label = self.source[int(index)]
        if self.train:
            augmented = train_transform(image, self.seed, epoch, int(index), self.mean, self.std,
                                        self.source.augmentations)
            return augmented, label
        return eval_transform(image, self.mean, self.std), label

    def __call__(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.read_latency_ms:
            time.sleep(self.read_latency_ms / 1e3)
        samples = [self.sample(epoch, int(i)) for i in indices]
        images = np.stack([s[0] for s in samples])
        labels = np.asarray([s[1] for s in samples], np.int32)
        return images, labels


def make_batch_maker(source: Source, options: LoaderOptions, train: bool) -> Callable[[int, np.ndarray], Batch]:
    """The one batch maker of ``source`` for both frameworks' loaders: images (augmented in training) or token
    batches padded per ``options.batching`` (a text source: common/data/text.py)."""
    from common.data.text import TextBatchMaker, TextSource, parse_buckets

    if isinstance(source, TextSource):
        # the buckets end at the split's longest text (pad-max's length): no bucket pads beyond what pad-max does
        return TextBatchMaker(source, train=train, seed=options.seed, read_latency_ms=options.read_latency_ms,
                              batching=options.batching, buckets=parse_buckets(options.buckets, source.longest),
                              pad_to=source.longest)
    return BatchMaker(source, train=train, seed=options.seed, read_latency_ms=options.read_latency_ms)


def loader_sampler(source: Source, options: LoaderOptions, train: bool) -> EpochSampler | LengthBucketSampler:
    """The sampler both frameworks' loaders read: ``make_sampler``'s, except for a text source's training split
    under bucket batching, whose batches are cut within a length bucket (``LengthBucketSampler``)."""
    from common.data.text import TextSource, parse_buckets

    if train and isinstance(source, TextSource) and options.batching == "bucket":
        buckets = np.asarray(parse_buckets(options.buckets, source.longest))
        return LengthBucketSampler(tuple(int(b) for b in np.searchsorted(buckets, source.lengths)),
                                   options.batch_size, options.seed, options.drop_last, options.rank,
                                   options.world_size)
    return make_sampler(source, options.batch_size, options.seed, train, options.drop_last, options.rank,
                        options.world_size)


def make_sampler(source: Source, batch_size: int, seed: int, train: bool, drop_last: bool = False,
                 rank: int = 0, world_size: int = 1) -> EpochSampler:
    """Training shuffles by (seed, epoch); evaluation walks the split in order."""
    return EpochSampler(len(source), batch_size, seed=seed, shuffle=train, drop_last=drop_last,
                        rank=rank, world_size=world_size)


def preview_batches(source: Source, batch_size: int, seed: int, train: bool, count: int | None,
                    epoch: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first ``count`` batches of an epoch (all with None) as the loaders would make them, built in
    this process: for benchmarks that time a model on pre-loaded batches."""
    maker = BatchMaker(source, train=train, seed=seed)
    return [maker(epoch, indices) for indices in make_sampler(source, batch_size, seed, train).batches(epoch)[:count]]


T = TypeVar("T")
Batch = tuple[np.ndarray, np.ndarray]  # (images NHWC float32 or tokens int32 (batch, length), labels int32)


def grouped(batches: Iterable[T], k: int) -> Iterator[list[T]]:
    """Groups of k consecutive batches (the micro-batches of one accumulated step); a short group at the
    end is dropped, so every optimizer step sees k micro-batches."""
    group: list[T] = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
