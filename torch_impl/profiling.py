"""A profiled window of training steps (torch.profiler); jax_impl/profiling.py mirrors it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from common.profiling import top_events


class StepProfiler:
    """Traces the steps run between ``start`` and ``stop``: a chrome trace plus the top ops by self time
    (device time on CUDA, host time on CPU)."""

    def __init__(self, folder: str, device: torch.device) -> None:
        self.folder = Path(folder)
        self.device = device
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self.steps = 0

    def start(self) -> None:
        self._profiler.start()

    def step(self) -> None:
        self.steps += 1

    def stop(self) -> dict[str, Any]:
        self._profiler.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / "torch_trace.json"
        self._profiler.export_chrome_trace(str(trace))
        cuda = self.device.type == "cuda"
        events = [(e.key, e.self_device_time_total if cuda else e.self_cpu_time_total)
                  for e in self._profiler.key_averages()]
        return {"tool": "torch.profiler", "trace": str(trace), "steps": self.steps,
                "ranked_by": "self CUDA time" if cuda else "self CPU time", "top_ops": top_events(events)}
