"""Epoch order and sharding, shared by every loader.

The epoch permutation depends on (seed, epoch) only. Sharding splits each *global* batch of
``batch_size * world_size`` samples into contiguous per-rank slices, so that data-parallel replicas
together see exactly the batch one process would see at the global batch size (the property the DDP and
pmap parity tests rely on). Shards are disjoint and, without ``drop_last``, cover the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.errors import DataError


@dataclass(frozen=True)
class EpochSampler:
    num_samples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise DataError(f"batch size must be positive, got {self.batch_size}")
        if self.num_samples <= 0:
            raise DataError(f"the data set is empty (num_samples={self.num_samples})")
        if self.world_size <= 0 or not 0 <= self.rank < self.world_size:
            raise DataError(f"rank {self.rank} is not valid for world_size {self.world_size}")
        if self.drop_last and self.num_samples < self.global_batch_size:
            raise DataError(
                f"drop_last with {self.num_samples} samples and a global batch of {self.global_batch_size} "
                "leaves no batch"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_samples)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches for ``epoch``: index arrays, a short last one unless ``drop_last``."""
        order = self.epoch_order(epoch)
        step = self.global_batch_size
        stop = (len(order) // step) * step if self.drop_last else len(order)
        shards = []
        for start in range(0, stop, step):
            global_batch = order[start : min(start + step, stop)]
            # A short last global batch is split as evenly as possible; a rank may get fewer samples.
            shard = np.array_split(global_batch, self.world_size)[self.rank]
            if len(shard):
                shards.append(shard)
        return shards

    def __len__(self) -> int:
        return len(self.batches(0))

    def indices(self, epoch: int) -> np.ndarray:
        batches = self.batches(epoch)
        return np.concatenate(batches) if batches else np.zeros(0, np.int64)


@dataclass(frozen=True)
class LengthBucketSampler:
    """Bucketing by length for variable-length text: the epoch's shuffled order (``EpochSampler``'s, by seed and
    epoch) is split by each example's bucket, batches are cut within a bucket, and the batches are shuffled again
    (by seed and epoch): every batch pads to its bucket's size only, so an epoch has at most one padded length a
    bucket. The epoch sees every example once, as the other strategies' epochs do (tested). Each bucket's last batch
    may be short unless ``drop_last``; a short batch is another batch shape (a recompile in a compiled step).

    Sharding as in ``EpochSampler``: each global batch of ``batch_size * world_size`` is split into per-rank slices.
    """

    bucket_of: tuple[int, ...]  # each example's bucket number (0: the shortest bucket)
    batch_size: int
    seed: int = 0
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        EpochSampler(len(self.bucket_of), self.batch_size, self.seed, True, False, self.rank, self.world_size)

    @property
    def num_samples(self) -> int:
        return len(self.bucket_of)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def batches(self, epoch: int) -> list[np.ndarray]:
        order = EpochSampler(self.num_samples, self.batch_size, self.seed).epoch_order(epoch)
        buckets = np.asarray(self.bucket_of)[order]
        step = self.global_batch_size
        global_batches = []
        for bucket in np.unique(buckets):
            members = order[buckets == bucket]
            stop = (len(members) // step) * step if self.drop_last else len(members)
            global_batches += [members[start:min(start + step, stop)] for start in range(0, stop, step)]
        if not global_batches:
            raise DataError(f"drop_last with buckets of fewer than {step} examples each leaves no batch")
        # a second permutation (of the batches), so that buckets interleave through the epoch
        shuffled = np.random.default_rng((self.seed, epoch, 1)).permutation(len(global_batches))
        shards = [np.array_split(global_batches[i], self.world_size)[self.rank] for i in shuffled]
        return [shard for shard in shards if len(shard)]

    def __len__(self) -> int:
        return len(self.batches(0))

    def indices(self, epoch: int) -> np.ndarray:
        batches = self.batches(epoch)
        return np.concatenate(batches) if batches else np.zeros(0, np.int64)
