"""Summaries of timed samples: median and spread, never a mean alone; and when this process started, for the
wall-clock side of time to accuracy (everything a user waits for, not only the steps)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.results import Summary, Timing

# The fallback start where /proc cannot say (not Linux): as early as this process can see itself, since common/
# is imported before either framework.
_IMPORTED_AT = time.time()
_START_TICKS_FIELD = 22  # /proc/[pid]/stat: starttime, in clock ticks after boot (proc(5))


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
                      images_per_s=sum(images) / sum(totals), samples_s=totals,
                      compute_samples_s=list(compute))


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


@functools.cache
def process_start_time() -> float:
    """The Unix time at which this process started, so a time to accuracy includes the interpreter, the framework
    imports, data loading and compilation: the wait a user has. (A run forked from a zygote, its imports done,
    starts at the fork: the driver forks no time-to-accuracy run, experiments/execution/runner.py.) Linux:
    /proc/self/stat's starttime after boot; elsewhere the time common.timing was imported (later than the real start
    by the interpreter's own start-up)."""
    try:
        return _boot_time() + _started_after_boot()
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def process_start_perf_counter() -> float:
    """What ``time.perf_counter()`` read when this process started (typically negative): subtract it from a
    perf_counter reading for seconds since the start, on the monotonic clock the step timings use."""
    return time.perf_counter() - (time.time() - process_start_time())


def _started_after_boot() -> float:
    """Seconds from boot to this process's start. The command name (field 2) may hold spaces and parentheses, so
    the fields are counted from after its closing parenthesis, which is followed by field 3."""
    stat = Path("/proc/self/stat").read_text()
    after_name = stat[stat.rindex(")") + 2:].split()
    return int(after_name[_START_TICKS_FIELD - 3]) / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    """The Unix time of boot. /proc/stat's btime is it truncated to whole seconds (up to 1 s early, which a short
    run's time to accuracy would show); now minus CLOCK_BOOTTIME, the clock starttime counts on, is the same
    instant unrounded. btime is the fallback where that clock is missing."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")
