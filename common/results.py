"""Typed run results and the rows they are stored as.

A trainer returns a ``RunResult``; the driver stores it in a ``RunRecord`` (experiments/execution/record.py: the
result plus what the plan knows) and every reader goes back through ``RunResult.from_row``. Rows carry
``schema``; rows written before it (schema 1) still read, and a field added since (the time-to-accuracy seconds)
reads as not measured (NaN, or an empty list) from a row without it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

Row = dict[str, Any]
SCHEMA = 2  # 1: the untyped rows before RunResult (no "schema" key)
STATUSES = ("ok", "diverged", "failed", "skipped")
NAN = float("nan")


@dataclass(frozen=True)
class Summary:
    """Median and spread of timed samples (seconds)."""

    median: float
    p10: float
    p90: float
    p99: float
    min: float
    max: float
    n: int


@dataclass(frozen=True)
class Timing:
    """Steady-state step timing: the first ``warmup_steps`` (the first with compilation) are kept apart."""

    timed_steps: int = 0
    first_step_s: float = NAN
    warmup_steps: int = 0
    step_s: Summary | None = None
    compute_s: Summary | None = None
    data_wait_s: Summary | None = None
    data_wait_fraction: float = NAN
    images_per_s: float = NAN
    # every timed step's seconds (data wait + compute), in order: a run's own spread, and what a within-run
    # interval resamples (empty in rows written before them)
    samples_s: list[float] = field(default_factory=list)
    compute_samples_s: list[float] = field(default_factory=list)  # the same steps' compute alone (data wait apart)

    @property
    def step_median_s(self) -> float:
        return self.step_s.median if self.step_s else NAN

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Timing:
        summaries = {k: Summary(**values[k]) for k in ("step_s", "compute_s", "data_wait_s") if values.get(k)}
        return cls(**{**_known(cls, values), **summaries})


@dataclass(frozen=True)
class Memory:
    """Bytes, where measured (None: not measurable on this device or mode)."""

    peak_allocated_bytes: int | None = None  # the device's peak (CUDA; JAX memory_stats)
    saved_for_backward_bytes: int | None = None  # activations kept for the backward pass of one micro-batch
    xla_temp_bytes: int | None = None  # XLA's compiled memory analysis of the jitted step
    xla_argument_bytes: int | None = None
    xla_output_bytes: int | None = None

    def get(self, name: str) -> float:
        value = getattr(self, name)
        return NAN if value is None else float(value)


@dataclass(frozen=True)
class Evaluation:
    """Accuracy and mean loss over the evaluation split (normalised, un-augmented test images in file order)."""

    step: int
    accuracy: float
    loss: float
    samples: int
    # Time to accuracy, stamped by the loop (NaN in rows written before them). elapsed_s: seconds from the process's
    # start to the end of this evaluation, so interpreter and framework imports, data loading, compilation and
    # earlier evaluations count, as a user waits for them; train_s: seconds in training steps alone (data wait +
    # compute, the first step included) up to this evaluation.
    elapsed_s: float = NAN
    train_s: float = NAN


@dataclass(frozen=True)
class Compilation:
    """What a compiled run's framework says of its compilations: graphs (torch.compile's unique graphs, jit's cache
    entries), seconds spent compiling them, and notes (torch's recompile limit reached: later shapes ran eager)."""

    graphs: int = 0
    seconds: float | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    """What one framework's training run reports (process 0 speaks for a run over several processes)."""

    framework: str
    status: str  # ok | diverged | failed | skipped
    steps_done: int = 0
    start_step: int = 0
    losses: list[float] = field(default_factory=list)
    loss_scales: list[float] = field(default_factory=list)
    step_elapsed_s: list[float] = field(default_factory=list)  # seconds from the process's start to each step's end
    timing: Timing = field(default_factory=Timing)
    memory: Memory = field(default_factory=Memory)
    evals: list[Evaluation] = field(default_factory=list)  # every evaluation, the final one last
    evaluation_s: float = NAN  # seconds spent evaluating, every evaluation together
    final_lr: float = NAN
    recompiles: int = 0  # compiled graphs beyond those of the first step (new shapes)
    graphs_compiled: int = 0
    compile_s: float | None = None  # seconds spent compiling, every graph (a recompile's too); None: not measured
    notes: list[str] = field(default_factory=list)  # techniques accepted with no effect here, and why
    device: str = ""
    framework_version: str = ""
    num_classes: int = 0
    synthetic_data: bool = False
    # the training augmentations its data source allowed (common/data/augment.py); None: a row from before they were
    # recorded
    augmentations: list[str] | None = None
    replicas: int = 1  # data-parallel replicas (the global batch is batch_size x replicas)
    processes: int = 1
    process_index: int = 0
    profile: dict[str, Any] | None = None
    error: str | None = None
    traceback: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown run status '{self.status}'; known: {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def eval(self) -> Evaluation | None:
        """The final evaluation (None if the run did not finish)."""
        return self.evals[-1] if self.evals and self.status == "ok" else None

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else NAN

    @classmethod
    def failed(cls, framework: str, error: str, status: str = "failed", traceback: str | None = None) -> RunResult:
        return cls(framework=framework, status=status, error=error, traceback=traceback)

    def to_row(self) -> Row:
        row = asdict(self)
        row["schema"] = SCHEMA
        return row

    @classmethod
    def from_row(cls, row: Row) -> RunResult:
        """A result from a stored row of this schema or of schema 1 (the dicts the trainers returned before)."""
        values = _known(cls, row)
        values["framework"] = row.get("framework", "")
        values["status"] = row.get("status", "failed")
        values["timing"] = Timing.from_dict(row.get("timing") or {})
        values["memory"] = Memory(**_known(Memory, row.get("memory") or {}))
        evals = [_evaluation(e) for e in row.get("evals") or []]
        if not evals and row.get("eval"):  # schema 1 rows may hold only the final one
            evals = [Evaluation(step=row.get("steps_done", 0), **_known(Evaluation, row["eval"]))]
        values["evals"] = evals
        if "framework_version" not in row:  # schema 1 kept the version under the framework's name
            values["framework_version"] = str(row.get(values["framework"], ""))
        values["evaluation_s"] = _seconds(row.get("evaluation_s"))
        return cls(**values)


def _evaluation(values: dict[str, Any]) -> Evaluation:
    known = _known(Evaluation, values)
    return Evaluation(**{**known, "elapsed_s": _seconds(known.get("elapsed_s")),
                         "train_s": _seconds(known.get("train_s"))})


def _seconds(value: float | None) -> float:
    """A stored duration; "not measured" (absent, null, or the NaN a JSON row reads back as a new float) is the one
    NAN, so a result read back from its row compares equal to the one written (NaN != NaN, but ``is`` holds)."""
    return NAN if value is None or not math.isfinite(value) else float(value)


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``cls`` (rows carry the plan's columns too)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}
