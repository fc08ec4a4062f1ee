"""Loader knobs shared by both adapters, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import DataError


@dataclass(frozen=True)
class LoaderOptions:
    """What a loader may tune. ``workers`` are processes (torch DataLoader workers / grain workers);
    ``prefetch`` is batches buffered per worker; ``pin_memory`` (torch) and ``device_prefetch`` (JAX, batches
    already on the device) are each framework's way to overlap host-to-device copies with compute."""

    batch_size: int
    workers: int = 0
    prefetch: int = 2
    pin_memory: bool = False
    persistent_workers: bool = False
    device_prefetch: int = 0
    drop_last: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    read_latency_ms: float = 0.0  # simulated slow storage (network filesystem): a wait per batch read
    # text sources only (common/data/text.py): how a batch of variable-length texts is padded
    batching: str = "pad-longest"
    buckets: str = "pow2"
    max_len: int = 256

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise DataError(f"batch size must be positive, got {self.batch_size}")
        if self.workers < 0:
            raise DataError(f"worker count must be 0 (load in the main process) or more, got {self.workers}")
        if self.prefetch <= 0:
            raise DataError(f"prefetch must be at least 1 batch per worker, got {self.prefetch}")
        if self.read_latency_ms < 0:
            raise DataError(f"read latency must be 0 or more ms, got {self.read_latency_ms}")
        if self.device_prefetch < 0:
            raise DataError(f"device prefetch must be 0 or more batches, got {self.device_prefetch}")
