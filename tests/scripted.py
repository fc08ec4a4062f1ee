"""A framework-free Backend for the loop's rules (imported as ``scripted``: pytest puts tests/ on the path): its
accuracy and loss are scripted, so the loop's decisions are checked in milliseconds, with no framework; ``Traced``
also writes down what the loop asks of it, in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.config import RunConfig
from common.loop import Place
from common.results import Compilation, Evaluation, Memory

STEPS_PER_EPOCH = 4  # 64 training images in batches of 16


class ScriptedLoader:
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def epoch(self, epoch: int, start_batch: int = 0):
        for _ in range(start_batch, self.batches):
            yield np.zeros((16, 1), np.float32), np.zeros(16, np.int32)


class Scripted:
    """A Backend whose accuracy after each step is scripted: the loop's decisions, with no framework."""

    name, version, device = "scripted", "0", "cpu"

    def __init__(self, accuracy: Callable[[int], float], loss: Callable[[int], float] = lambda step: 2.0,
                 place: Place | None = None) -> None:
        self.accuracy, self.loss, self.place = accuracy, loss, place or Place()
        self.evaluated: list[int] = []
        self.steps = 0

    def start(self, config: RunConfig) -> Place:
        return self.place

    def loaders(self, train_source, eval_source):
        return ScriptedLoader(STEPS_PER_EPOCH), ScriptedLoader(1)

    def build(self, arch, total_steps: int):
        return 0, []

    def to_device(self, group):
        return group

    def step(self, group, inject_inf: bool) -> float:
        time.sleep(0.002)  # a step takes time, so train_s grows
        self.steps += 1
        return self.loss(self.steps)

    def loss_scale(self) -> float:
        return 1.0

    def save(self, folder: str, step: int) -> None: ...

    def gather(self) -> None: ...

    def evaluate(self, loader, step: int) -> Evaluation:
        time.sleep(0.002)
        self.evaluated.append(step)
        return Evaluation(step=step, accuracy=self.accuracy(step), loss=1.0, samples=64)

    def memory(self, first) -> Memory:
        return Memory()

    def profiler(self, folder: str):
        raise AssertionError("not profiled here")

    def save_weights(self, path: str) -> None: ...

    def compilation(self) -> Compilation:
        return Compilation()

    def finish(self, clean: bool) -> None: ...


def linear(step: int) -> float:
    return step / 20  # 0.2 after the first epoch, 0.4 after the second, ...


def scalars(folder: Path) -> dict[str, list]:
    """Every scalar series under ``folder``, read with tensorboard's own reader (all events kept)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    reader.Reload()
    return {tag: reader.Scalars(tag) for tag in reader.Tags()[SCALARS]}


class Traced(Scripted):
    """A scripted backend that writes down what the loop asks of it, in order: each epoch's iterator as it is made
    and as it ends, steps, checkpoints, evaluations, the profiler's window; ``start`` is the step build resumes at,
    and ``scales`` the fp16 loss scale after each step (a fall: that step was skipped)."""

    def __init__(self, start: int = 0, scales: Callable[[int], float] = lambda step: 1.0) -> None:
        super().__init__(linear)
        self.resume_at, self.scales, self.events = start, scales, []

    def loaders(self, train_source, eval_source):
        events = self.events

        class Loader(ScriptedLoader):
            def epoch(self, epoch: int, start_batch: int = 0):
                events.append(("epoch", epoch, start_batch))

                def batches():
                    try:
                        yield from ScriptedLoader.epoch(self, epoch, start_batch)
                    finally:
                        events.append(("closed", epoch))

                return batches()

        return Loader(STEPS_PER_EPOCH), ScriptedLoader(1)

    def build(self, arch, total_steps: int):
        self.steps = self.resume_at
        return self.resume_at, []

    def step(self, group, inject_inf: bool) -> float:
        self.events.append(("step", self.steps, len(group)))
        return super().step(group, inject_inf)

    def loss_scale(self) -> float:
        return self.scales(self.steps)

    def save(self, folder: str, step: int) -> None:
        self.events.append(("save", step))

    def evaluate(self, loader, step: int) -> Evaluation:
        self.events.append(("evaluate", step))
        return super().evaluate(loader, step)

    def profiler(self, folder: str):
        events = self.events

        class Profiler:
            def start(self) -> None:
                events.append(("profiler", "start"))

            def step(self) -> None:
                events.append(("profiler", "step"))

            def stop(self) -> dict:
                events.append(("profiler", "stop"))
                return {"trace": folder}

        return Profiler()

    def finish(self, clean: bool) -> None:
        self.events.append(("finish", clean))
