"""Batch assembly shared by both loaders: the same function turns index arrays into arrays."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from common.data.augment import channel_stats, eval_transform, train_transform
from common.data.sampler import EpochSampler
from common.data.sources import Source


@dataclass
class BatchMaker:
    """Turns (epoch, indices) into an NHWC float32 image batch and int32 labels, identically everywhere."""

    source: Source
    train: bool
    seed: int = 0
    read_latency_ms: float = 0.0  # simulated storage latency per batch: what loader workers exist to hide
    mean: np.ndarray = field(init=False)
    std: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mean, self.std = channel_stats(self.source.name.split("+")[0])

    def sample(self, epoch: int, index: int) -> tuple[np.ndarray, int]:
        image, label = self.source[int(index)]
        if self.train:
            return train_transform(image, self.seed, epoch, int(index), self.mean, self.std), label
        return eval_transform(image, self.mean, self.std), label

    def __call__(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.read_latency_ms:
            time.sleep(self.read_latency_ms / 1e3)
        samples = [self.sample(epoch, int(i)) for i in indices]
        images = np.stack([s[0] for s in samples])
        labels = np.asarray([s[1] for s in samples], np.int32)
        return images, labels


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


def grouped(batches: Iterable[T], k: int) -> Iterator[list[T]]:
    """Groups of k consecutive batches (the micro-batches of one accumulated step); a short group at the
    end is dropped, so every optimizer step sees k micro-batches."""
    group: list[T] = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
