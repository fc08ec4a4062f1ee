"""A profiled window of training steps (jax.profiler); torch_impl/profiling.py mirrors it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jax

from common.profiling import top_events


class StepProfiler:
    """Traces the steps run between ``start`` and ``stop``: a TensorBoard/XProf trace (xplane) plus a
    Perfetto JSON one, and the top events of the latter by total time. Python frames (``$file:line``)
    are left out of the ranking: they would nest over every op."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.steps = 0

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(str(self.folder), create_perfetto_trace=True)

    def step(self) -> None:
        self.steps += 1

    def stop(self) -> dict[str, Any]:
        jax.profiler.stop_trace()
        traces = sorted(self.folder.glob("plugins/profile/*/perfetto_trace.json.gz"))
        events: list[tuple[str, float]] = []
        if traces:
            content = json.loads(gzip.decompress(traces[-1].read_bytes()))
            raw = content["traceEvents"] if isinstance(content, dict) else content
            events = [(e["name"], float(e.get("dur", 0.0))) for e in raw
                      if e.get("ph") == "X" and not str(e.get("name", "")).startswith("$")]
        return {"tool": "jax.profiler", "trace": str(traces[-1]) if traces else None, "steps": self.steps,
                "ranked_by": "total time of trace events (host dispatch and device ops)", "top_ops": top_events(events)}
