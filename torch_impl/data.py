"""torch DataLoader over the shared source, sampler and transforms.

Workers assemble whole batches (the dataset is indexed by (epoch, batch indices)), which mirrors the
grain pipeline on the JAX side, and the DataLoader knobs are passed straight through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from common.config import RunConfig
from common.data import EpochSampler, Source
from common.data.batches import loader_sampler, make_batch_maker
from common.data.loader_options import LoaderOptions
from common.timing import time_batches
from torch_impl.techniques import param_dtype

BatchKey = tuple[int, np.ndarray]


def to_nchw(images: np.ndarray) -> torch.Tensor:
    """The shared pipeline's NHWC float32 batch as torch's NCHW tensor (on the CPU); a text batch's tokens
    (batch, length) as they are."""
    if images.ndim == 2:
        return torch.from_numpy(images)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


class BatchDataset(Dataset):
    """``dataset[(epoch, indices)]`` -> (images NCHW float32 or tokens, labels int64) for one batch."""

    def __init__(self, maker: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
        self.maker = maker

    def __getitem__(self, key: BatchKey) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        epoch, indices = key
        images, labels = self.maker(epoch, indices)
        return to_nchw(images), torch.from_numpy(labels.astype(np.int64))


class EpochBatchSampler(Sampler):
    """Yields (epoch, indices) keys; set_epoch runs in the main process, so persistent workers follow it."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch = epoch
        self.start_batch = start_batch

    def __iter__(self) -> Iterator[BatchKey]:
        epoch = self.epoch
        return iter([(epoch, b) for b in self.sampler.batches(epoch)[self.start_batch:]])

    def __len__(self) -> int:
        return len(self.sampler)


class TorchLoader:
    """One loader over the shared pipeline; ``epoch(e)`` iterates that epoch's batches."""

    def __init__(self, source: Source, options: LoaderOptions, train: bool) -> None:
        self.options = options
        self.sampler = loader_sampler(source, options, train)
        self.batch_sampler = EpochBatchSampler(self.sampler)
        extra = {}
        if options.workers > 0:
            extra = {"prefetch_factor": options.prefetch, "persistent_workers": options.persistent_workers}
            if "jax" in sys.modules:
                # Forking a process in which JAX's threads run can deadlock (shared test processes only;
                # measured runs are one framework per process and keep torch's default fork).
                extra["multiprocessing_context"] = "spawn"
        self.loader = DataLoader(
            BatchDataset(make_batch_maker(source, options, train)),
            batch_size=None,  # the dataset already returns whole batches
            sampler=self.batch_sampler,
            num_workers=options.workers,
            # pin_memory without CUDA is accepted and has no effect (torch only warns); keep it quiet.
            pin_memory=options.pin_memory and torch.cuda.is_available(),
            **extra,
        )

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches from ``start_batch`` on (a resumed run continues mid-epoch)."""
        self.batch_sampler.set_epoch(epoch, start_batch)
        return iter(self.loader)


def make_loader(source: Source, options: LoaderOptions, *, train: bool) -> TorchLoader:
    """``train``: augmented and shuffled (the training split); otherwise normalised, un-augmented images in file
    order (evaluation). No default: an evaluation loader built with the training transform went unseen before."""
    return TorchLoader(source, options, train)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def current_device() -> torch.device:
    """The device this process computes on: torch's current CUDA device (the replica's own once
    torch_impl/parallel.py's ``start`` has set it), or the CPU. The models carry it from there (their parameters'
    device), so no function takes a device of its own: JAX's twin has none to take either."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def to_device(config: RunConfig, images: torch.Tensor, labels: torch.Tensor, device: torch.device):
    """A host batch on ``device``, images in the run's parameter dtype and memory format (token ids as they are)."""
    non_blocking = config.pin_mem and device.type == "cuda"
    images = images.to(device, non_blocking=non_blocking)
    if not images.is_floating_point():  # a text batch's token ids: an index, never a value to cast
        return images, labels.to(device, non_blocking=non_blocking)
    images = images.to(param_dtype(config))
    if config.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=non_blocking)


def synchronize(device: torch.device) -> None:
    """Waits for queued device work, so a timer stops when the work is done, not when it was queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loader(loader: TorchLoader, epoch: int, max_batches: int) -> tuple[float, list[float]]:
    """(seconds to the first batch on the device, seconds for each later batch on the device)."""
    device = default_device()
    non_blocking = loader.options.pin_memory and device.type == "cuda"

    def deliver(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        for tensor in batch:
            tensor.to(device, non_blocking=non_blocking)
        synchronize(device)

    return time_batches(loader.epoch(epoch), deliver, max_batches)
