"""Summaries of timed samples: median and spread, never a mean alone."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from common.results import Summary, Timing


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, p99, min, max and count of ``samples`` (seconds or any unit)."""
    if len(samples) == 0:
        raise ValueError("no timed samples to summarize")
    values = np.asarray(samples, dtype=np.float64)
    return {
        "median": float(np.median(values)),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
        "min": float(values.min()),
        "max": float(values.max()),
        "n": int(len(values)),
    }


class StepTimer:
    """Per optimizer step: seconds waiting for data and seconds of (synchronized) device compute.

    The first ``warmup`` steps are kept apart: the first step's time is reported as compile time (it
    includes tracing/compilation), and none of them enter the steady-state statistics.
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = max(warmup, 1)
        self.data_wait: list[float] = []
        self.compute: list[float] = []
        self.images: list[int] = []

    def record(self, data_wait_s: float, compute_s: float, images: int) -> None:
        self.data_wait.append(data_wait_s)
        self.compute.append(compute_s)
        self.images.append(images)

    def summary(self) -> Timing:
        if not self.compute:
            return Timing()
        first = self.data_wait[0] + self.compute[0]
        data, compute, images = self.data_wait[self.warmup:], self.compute[self.warmup:], self.images[self.warmup:]
        head = Timing(first_step_s=first, warmup_steps=min(self.warmup, len(self.compute)), timed_steps=len(compute))
        if not compute:
            return head
        totals = [d + c for d, c in zip(data, compute, strict=True)]
        return Timing(first_step_s=head.first_step_s, warmup_steps=head.warmup_steps, timed_steps=head.timed_steps,
                      step_s=Summary(**summarize(totals)), compute_s=Summary(**summarize(compute)),
                      data_wait_s=Summary(**summarize(data)), data_wait_fraction=sum(data) / sum(totals),
                      images_per_s=sum(images) / sum(totals))


def time_batches(batches: Iterable[Any], wait: Callable[[Any], Any], max_batches: int) -> tuple[float, list[float]]:
    """(seconds to the first batch, seconds for each later batch), each stopped only once ``wait`` has
    returned for that batch (its device transfer is done)."""
    clock = time.perf_counter
    start = clock()
    first: float | None = None
    times: list[float] = []
    for number, batch in enumerate(batches):
        wait(batch)
        now = clock()
        if first is None:
            first = now - start
        else:
            times.append(now - start)
        start = now
        if number + 1 >= max_batches:
            break
    return float(first or 0.0), times
