"""What a loader reads of a run, in one object both adapters take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """RunConfig's loader knobs as a loader reads them (their defaults, help and bounds are RunConfig's, and
    ``common.workloads.loader_options`` builds this from a config: evaluation reads in the main process, without the
    simulated latency), plus this process's place: its ``rank`` slice of a global batch of ``world_size`` slices.
    ``workers`` are processes (torch DataLoader workers / grain workers); ``pin_memory`` (torch) and
    ``device_prefetch`` (JAX) are each framework's way to overlap host-to-device copies with compute; ``batching``,
    ``buckets`` and ``max_len`` pad a text source's batches (common/data/text.py)."""

    batch_size: int
    workers: int
    prefetch: int
    pin_memory: bool
    persistent_workers: bool
    device_prefetch: int
    drop_last: bool
    seed: int
    read_latency_ms: float
    batching: str
    buckets: str
    max_len: int
    rank: int = 0
    world_size: int = 1
