"""Inference variants (common/inference.py: eager, compiled, folded, the INT8 methods, int4, onnxruntime,
tensorrt) of one framework in one process, each row naming its method in the same words in both frameworks:
batch-1 latency p50/p99 over timed calls, each on the next eval example (for text: at its real length, padded per
the config's batching), throughput per batch size, and accuracy on the eval split with its delta against the same
framework's eager fp32. Compilation is kept apart: the first call and then one call on every other distinct padded
shape of the timed inputs (a jitted text model compiles one program per shape) are timed on their own before any
timed call. Every call is host batch in -> host logits out (synchronized). The rows are "infer" rows of a store."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.config import RunConfig
from common.data.batches import make_batch_maker, make_sampler
from common.data.text import PAD, TextSource
from common.inference import METHODS
from common.results import RunResult
from common.timing import summarize
from common.workloads import arch as describe
from common.workloads import loader_options, num_classes, open_sources, workload_for
from experiments.execution.frameworks import device_name, module
from experiments.execution.host import host_info
from experiments.execution.paired import paired_config, run_framework
from experiments.execution.runner import run_isolated
from experiments.execution.store import atomic_write_text

HostBatch = tuple[np.ndarray, np.ndarray]
Predict = Callable[[np.ndarray], np.ndarray]
TRAINER = "torch"  # the framework whose trainer makes the weights that both frameworks infer with
EVAL_BATCH = 128  # accuracy is scored over eval batches of this many examples


@dataclass(frozen=True)
class InferOptions:
    calls: int = 100  # timed batch-1 calls (p99 needs >= 100)
    warmup: int = 10
    throughput_batches: tuple[int, ...] = (32, 128)
    throughput_calls: int = 10
    calibration_batches: int = 8  # INT8 calibration: batches of 32 images
    eval_batches: int | None = None  # None: the whole eval split
    weights_from: str = ""  # where the weights came from (given, trained N epochs, random): part of the settings

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throughput_batches": list(self.throughput_batches)}


class EvalInputs:
    """The eval split and its one batch maker (common/data/batches.py: images, or tokens padded per the config's
    batching), opened once: every input a variant sees is made by it, so timing, throughput and accuracy see the
    shapes a loader would make, never a second collator's."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.source = open_sources(config)[1]
        self.maker = make_batch_maker(self.source, loader_options(config, train=False), train=False)

    @property
    def is_text(self) -> bool:
        return isinstance(self.source, TextSource)

    def batches(self, batch_size: int, limit: int | None) -> list[HostBatch]:
        """The split's first ``limit`` batches (all if None), in file order, as the eval loader makes them."""
        sampler = make_sampler(self.source, batch_size, self.config.seed, train=False)
        return [self.maker(0, indices) for indices in sampler.batches(0)[:limit]]

    def first(self, count: int) -> HostBatch:
        """One batch of the split's first ``count`` examples (from the start again when the split is shorter)."""
        return self.maker(0, np.arange(count) % len(self.source))

    def singles(self, count: int) -> list[np.ndarray]:
        """``count`` batch-1 inputs, each the next eval example (from the start again when the split is shorter):
        a text's real length, padded as its batching pads a batch of one."""
        return [self.maker(0, np.asarray([i % len(self.source)]))[0] for i in range(count)]

    def real_lengths(self, count: int) -> np.ndarray:
        """The token counts of the texts ``singles(count)`` holds, before padding."""
        if not isinstance(self.source, TextSource):
            raise TypeError(f"{self.source.name} holds images: they have no lengths")
        return self.source.lengths[np.arange(count) % len(self.source)]


def eval_batches(config: RunConfig, batch_size: int, limit: int | None) -> list[HostBatch]:
    """The eval split's first ``limit`` batches (all if None), as numpy arrays, in file order."""
    return EvalInputs(config).batches(batch_size, limit)


def _timed(predict: Predict, inputs: list[np.ndarray]) -> list[float]:
    samples = []
    for x in inputs:
        start = time.perf_counter()
        predict(x)
        samples.append(time.perf_counter() - start)
    return samples


def _throughput(predict: Predict, batch: np.ndarray, calls: int) -> dict[str, float]:
    predict(batch)  # a new shape: a jitted variant compiles here, untimed
    samples = _timed(predict, [batch] * calls)
    times = summarize(samples)
    # "images_per_s" is examples per second, texts too: the report's column reads this key for every family; the
    # calls' own times are kept for the report's interval
    out = {"images_per_s": len(batch) / times["median"], "median_ms": 1e3 * times["median"],
           "samples_ms": [1e3 * t for t in samples]}
    if batch.ndim == 2:  # tokens: what the padding costs is the padded length against the real tokens
        real_tokens = int((batch != PAD).sum())
        out.update({"padded_length": int(batch.shape[1]), "real_tokens_per_s": real_tokens / times["median"]})
    return out


def _compile_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def _batch1(predict: Predict, inference: Any, inputs: EvalInputs, options: dict[str, Any],
            row: dict[str, Any]) -> None:
    """Batch-1 latency over ``calls`` different eval examples. The first call (``first_call_s``) and one call on
    every other distinct padded shape (``warmup_s``) run before the timed ones, so a variant that compiles per shape
    compiles outside the percentiles; then ``warmup`` more untimed calls, then the timed ones."""
    singles = inputs.singles(options["calls"])
    shapes = list(dict.fromkeys(x.shape for x in singles))  # first-appearance order
    counts = inference.compile_counts(predict)
    start = time.perf_counter()
    predict(singles[0])
    row["first_call_s"] = time.perf_counter() - start  # includes compilation for compiled variants
    start = time.perf_counter()
    for shape in shapes[1:]:
        predict(next(x for x in singles if x.shape == shape))
    row["warmup_s"] = time.perf_counter() - start  # every other shape's first call, its compilation included
    compiled = _compile_delta(counts, inference.compile_counts(predict))
    for i in range(options["warmup"]):
        predict(singles[i % len(singles)])
    timed = _timed(predict, singles)
    b1 = summarize(timed)
    # the calls' own times, in input order (call i of every variant is the same example: a paired comparison)
    row["latency_b1_ms"] = {"p50": 1e3 * b1["median"], "p99": 1e3 * b1["p99"], "min": 1e3 * b1["min"], "n": b1["n"],
                            "samples": [1e3 * t for t in timed]}
    row["b1_shapes"] = len(shapes)
    if compiled:
        row["compiled_in_warmup"] = compiled
    if inputs.is_text:
        real = inputs.real_lengths(options["calls"])
        row["b1_lengths"] = {"real_min": int(real.min()), "real_median": float(np.median(real)),
                             "real_max": int(real.max()), "examples": min(len(real), len(inputs.source))}
        padded = sorted({shape[1] for shape in shapes})
        what = (f"batch 1: {len(real)} calls over eval texts of {int(real.min())}-{int(real.max())} tokens, padded "
                f"{inputs.config.batching} to {len(shapes)} shape(s) ({padded[0]}-{padded[-1]}), each warmed up "
                f"before timing")
        built = {k: v for k, v in compiled.items() if v}
        if built:
            what += "; compiled in the warm-up: " + ", ".join(f"{v} {k}" for k, v in built.items())
        row["note"] = f"{row['note']}; {what}"


def measure_variant(framework: str, name: str, config: RunConfig, weights: str | None,
                    options: dict[str, Any]) -> dict[str, Any]:
    """One variant: build it, time batch 1 and the throughput batches, score the eval split. A variant that means
    nothing for the model's family (its workload's ``no_inference``: folding a model without BatchNorm) is skipped
    with the workload's reason, before anything is built."""
    # what the variant computes, in the same words in both frameworks (how this framework runs it: the note)
    row: dict[str, Any] = {"framework": framework, "variant": name, "method": METHODS.get(name, name)}
    meaningless = workload_for(config.model).no_inference.get(name)
    if meaningless:
        return {**row, "status": "skipped", "note": meaningless}
    inference = module(framework, "inference")
    arch = describe(config, num_classes(config))
    inputs = EvalInputs(config)
    batches = inputs.batches(EVAL_BATCH, options["eval_batches"])
    calibration = [x for x, _ in inputs.batches(32, options["calibration_batches"])]  # static INT8 only
    try:
        predict, note = inference.build(name, config, arch, weights, calibration)
    except inference.Unavailable as exc:
        return {**row, "status": "skipped", "note": str(exc)}
    row["note"] = note
    _batch1(predict, inference, inputs, options, row)
    row["throughput"] = {str(batch): _throughput(predict, inputs.first(batch)[0], options["throughput_calls"])
                         for batch in options["throughput_batches"]}
    correct = seen = 0
    for x, labels in batches:
        correct += int((predict(x).argmax(1) == labels).sum())
        seen += len(labels)
    row.update({"status": "ok", "accuracy": correct / seen, "eval_samples": seen,
                "eval_batches": options["eval_batches"], "num_classes": inputs.source.num_classes})
    return row


def measure_in_process(payload: dict[str, Any]) -> dict[str, Any]:
    """Every requested variant of one framework, in this process (a failure fails that variant only)."""
    config = RunConfig.from_dict(payload["config"])
    rows = []
    for name in payload["variants"]:
        try:
            rows.append(measure_variant(payload["framework"], name, config, payload["weights"], payload["options"]))
        except Exception as exc:  # recorded, the next variant goes on
            rows.append({"framework": payload["framework"], "variant": name, "status": "failed",
                         "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]})
    eager = next((r["accuracy"] for r in rows if r["variant"] == "eager" and r["status"] == "ok"), None)
    reference = eager if eager is not None else payload.get("reference_accuracy")  # eager measured before
    for row in rows:
        if reference is not None and row.get("status") == "ok":
            row["accuracy_delta"] = row["accuracy"] - reference
    return {"status": "ok", "rows": rows, "device": device_name(payload["framework"])}


def trained_weights_path(config: RunConfig, epochs: int, out: Path) -> Path:
    """Where the weights trained for inference are kept (one file per model, width, epochs and seed)."""
    return out / "weights" / f"trained-{config.model}-w{config.width}-e{epochs}-s{config.seed}.npz"


def train_weights(config: RunConfig, epochs: int, out: Path, timeout_s: float | None) -> tuple[str, dict[str, Any]]:
    """Trains the model with the torch trainer (isolated) and returns its final weights (torch-keyed .npz) with what
    the training was; weights trained before are reused, with the record of their training (a .json beside)."""
    path = trained_weights_path(config, epochs, out)
    record = path.with_suffix(".json")
    if path.exists():
        earlier = json.loads(record.read_text()) if record.exists() else {"epochs": epochs}
        return str(path), {**earlier, "reused": str(path)}
    trained = paired_config(config.replace(steps=None, epochs=epochs, save_weights=str(path), eval_batches=None),
                            out / "weights")
    result: RunResult = run_framework(TRAINER, trained, timeout_s)
    if not result.ok:
        raise RuntimeError(f"training the model to infer with failed: {result.error or result.status}")
    training = {"epochs": epochs, "train_accuracy_eval": result.eval.accuracy if result.eval else None}
    atomic_write_text(record, json.dumps(training))
    return str(path), training


def infer_rows(framework: str, config: RunConfig, weights: str | None, variants: list[str], options: InferOptions,
               training: dict[str, Any], timeout_s: float | None,
               reference_accuracy: float | None = None) -> list[dict[str, Any]]:
    """Every variant of ``framework`` in its own process, as the store's "infer" rows (a crashed process fails
    every variant it held). ``reference_accuracy``: the framework's eager accuracy measured before, for the deltas
    when eager is not among ``variants``."""
    result = run_isolated("infer", {"framework": framework, "config": config.to_dict(), "weights": weights,
                                    "variants": list(variants), "options": options.to_dict(),
                                    "reference_accuracy": reference_accuracy}, timeout_s=timeout_s)
    failed = {"framework": framework, "status": "failed", "error": result.get("error")}
    rows = result.get("rows") or [{**failed, "variant": v} for v in variants]
    return [{"key": f"infer/{framework}/{row['variant']}", "command": "infer", "config": config.to_dict(),
             "weights": weights, "training": training, "device": result.get("device"), "host": host_info(),
             "options": options.to_dict(), **{k: v for k, v in row.items() if k != "traceback"}} for row in rows]
