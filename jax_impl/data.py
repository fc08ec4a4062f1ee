"""grain pipeline over the shared source, sampler and transforms, plus a device-prefetch stage.

grain workers assemble whole batches (as torch DataLoader workers do), and ``device_prefetch`` keeps N
batches already transferred to the device: JAX's analogue of pinned memory + prefetch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grain
import jax
import numpy as np
from absl import flags

from common.data import Source
from common.data.batches import loader_sampler, make_batch_maker
from common.data.loader_options import LoaderOptions
from common.timing import time_batches

# grain reads absl flags in its workers; a library user never calls absl.app.run, so mark them parsed.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


@dataclass
class _EpochBatch:
    """Picklable map function for grain workers: indices -> (images NHWC, labels)."""

    maker: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]  # common.data.batches.make_batch_maker
    epoch: int

    def __call__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.maker(self.epoch, indices)


def device_prefetch(batches: Iterator, size: int, device: jax.Device | None = None) -> Iterator:
    """Keeps ``size`` batches in flight on the device (device_put is asynchronous); 0 transfers on demand."""
    queue: collections.deque = collections.deque()
    for batch in batches:
        queue.append(jax.device_put(batch, device))
        if len(queue) > size:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


class JaxLoader:
    """One loader over the shared pipeline; ``epoch(e)`` iterates that epoch's batches as jax arrays."""

    def __init__(self, source: Source, options: LoaderOptions, train: bool) -> None:
        self.options = options
        self.sampler = loader_sampler(source, options, train)
        self.maker = make_batch_maker(source, options, train)

    def __len__(self) -> int:
        return len(self.sampler)

    def host_batches(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The epoch's batches from ``start_batch`` on as numpy arrays, before any device transfer."""
        batches = self.sampler.batches(epoch)[start_batch:]
        if not batches:
            return iter(())
        dataset = grain.MapDataset.source(batches).map(_EpochBatch(self.maker, epoch))
        # Data is in memory, so no reader threads (grain's advice); parallelism comes from worker processes.
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=self.options.prefetch))
        if self.options.workers > 0:
            iterable = iterable.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=self.options.workers,
                                             per_worker_buffer_size=self.options.prefetch)
            )
        return iter(iterable)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[jax.Array, jax.Array]]:
        """The epoch's batches from ``start_batch`` on (a resumed run continues mid-epoch)."""
        return device_prefetch(self.host_batches(epoch, start_batch), self.options.device_prefetch)


def make_loader(source: Source, options: LoaderOptions, *, train: bool) -> JaxLoader:
    """``train``: augmented and shuffled (the training split); otherwise normalised, un-augmented images in file
    order (evaluation). No default: an evaluation loader built with the training transform went unseen before."""
    return JaxLoader(source, options, train)


def time_loader(loader: JaxLoader, epoch: int, max_batches: int) -> tuple[float, list[float]]:
    """(seconds to the first batch on the device, seconds for each later batch on the device)."""
    return time_batches(loader.epoch(epoch), jax.block_until_ready, max_batches)
