"""Framework-free side of profiling: ranking the events of a trace the same way for both frameworks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable


def top_events(events: Iterable[tuple[str, float]], count: int = 10) -> list[dict[str, float | str | int]]:
    """(name, microseconds) pairs -> the ``count`` names with the most total time, largest first."""
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name, micros in events:
        totals[name] += micros
        calls[name] += 1
    ranked = sorted(totals, key=totals.__getitem__, reverse=True)[:count]
    return [{"name": name, "ms": totals[name] / 1e3, "calls": calls[name]} for name in ranked]
