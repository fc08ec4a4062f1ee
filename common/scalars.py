"""TensorBoard scalars of a run (``tensorboard --logdir DIR``): tensorboardX's event files, written by the loop.

Written synchronously, in the loop's own thread, between steps: tensorboardX's ``SummaryWriter`` hands each
scalar to a worker thread through a ``multiprocessing.Queue`` (~60 us of pickling, piping and encoding per scalar
on this CPU, much of it on other threads while the next step is being timed, and a put blocks once 10 wait), so
here the same event file is written by tensorboardX's own ``EventsWriter`` (~15 us per event, all of it outside
the timed part of a step). The file is the one SummaryWriter writes; tensorboard's reader reads it (tested).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

FLUSH_EVERY_S = 10.0  # a live TensorBoard sees the run at most this far behind (flushes happen between steps)


class Scalars:
    """One run's scalars under ``folder/framework`` (one TensorBoard run per framework, so the twins of a paired
    run sit side by side); nothing at all, not even an import, when ``folder`` is None."""

    def __init__(self, folder: str | None, framework: str) -> None:
        self.folder: Path | None = None  # where the event files are
        self._writer: Any = None
        self._classes: tuple[Any, Any] | None = None
        self._flushed = time.monotonic()
        if folder is None:
            return
        writer_class, event, summary = _tensorboardx()
        self._classes = (event, summary)
        self.folder = Path(folder) / framework
        self.folder.mkdir(parents=True, exist_ok=True)
        # The file is named after the second and the host; the pid keeps two runs started in one second apart.
        self._writer = writer_class(str(self.folder / "events"), f".{os.getpid()}")

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def write(self, step: int, wall_time: float, values: dict[str, float]) -> None:
        """``values`` (tag -> number) at ``step``, as one event (TensorBoard reads every value of an event)."""
        if self._writer is None or self._classes is None:
            return
        event, summary = self._classes
        tagged = [summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()]
        self._writer.write_event(event(wall_time=wall_time, step=step, summary=summary(value=tagged)))
        if time.monotonic() - self._flushed > FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        """Flushes and closes the file; safe to call twice (the loop closes in a ``finally``)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Scalars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensorboardx() -> tuple[Any, Any, Any]:
    """tensorboardX's event writer and protos, imported without torch: its package ``__init__`` imports writer.py,
    which tries ``import torch`` (only to name what its add_* functions accept) and so would load a second framework
    into a JAX process (~2 s and its memory). A None in sys.modules makes that import fail as if torch were absent,
    which tensorboardX handles; it is removed at once, so torch imports normally afterwards."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
    finally:
        if blocked and sys.modules.get("torch", False) is None:
            del sys.modules["torch"]
    return EventsWriter, Event, Summary
