"""One stored row: a trainer's ``RunResult`` (common/results.py) with what the plan knows about it: its key, the
command, the config, the host and the plan's own columns. The store (experiments/execution/store.py) holds these."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from common.results import NAN, Row, RunResult


@dataclass(frozen=True)
class RunRecord:
    """One stored row: a run's result with what the plan knows about it."""

    key: str  # unique in a store: a rerun skips a key that finished
    command: str  # ladder | sweep | run | ...
    result: RunResult
    config: dict[str, Any] = field(default_factory=dict)  # RunConfig.to_dict() of the run
    host: dict[str, Any] = field(default_factory=dict)
    wall_s: float = NAN
    fields: dict[str, Any] = field(default_factory=dict)  # the plan's own columns (rung, sweep value, repeat, ...)

    @property
    def framework(self) -> str:
        return self.result.framework

    @property
    def status(self) -> str:
        return self.result.status

    def to_row(self) -> Row:
        row = {**self.fields, **self.result.to_row(), "key": self.key, "command": self.command, "config": self.config,
               "host": self.host, "wall_s": self.wall_s}
        row.pop("traceback", None)  # the error line stays; the traceback is for the worker's log
        return row

    @classmethod
    def from_row(cls, row: Row) -> RunRecord:
        result = RunResult.from_row(row)
        own = {"key", "command", "config", "host", "wall_s", "schema", "eval"} | {f.name for f in fields(RunResult)}
        own |= {result.framework} if "framework_version" not in row else set()
        wall = row.get("wall_s")
        return cls(key=row["key"], command=row.get("command", ""), result=result, config=row.get("config") or {},
                   host=row.get("host") or {}, wall_s=NAN if wall is None or not math.isfinite(wall) else float(wall),
                   fields={k: v for k, v in row.items() if k not in own})
