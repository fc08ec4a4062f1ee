"""Inference variants (eager, compiled, folded, int8, onnxruntime, tensorrt) of one framework in one process:
batch-1 latency p50/p99 over timed calls after warm-up (the first call, with compilation, kept apart),
throughput per batch size, and accuracy on the eval split with its delta against the same framework's eager
fp32. Every call is host batch in -> host logits out (synchronized). The rows are "infer" rows of a store."""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.config import RunConfig
from common.data.batches import preview_batches
from common.results import RunResult
from common.timing import summarize
from common.versions import host_info
from common.workloads import arch as describe
from common.workloads import num_classes, open_sources, workload_for
from experiments.execution.frameworks import device_name, module
from experiments.execution.paired import paired_config, run_framework
from experiments.execution.runner import run_isolated

HostBatch = tuple[np.ndarray, np.ndarray]
TRAINER = "torch"  # the framework whose trainer makes the weights that both frameworks infer with


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


def eval_batches(config: RunConfig, batch_size: int, limit: int | None) -> list[HostBatch]:
    """The eval split's first ``limit`` batches (all if None), as numpy arrays, in file order."""
    return preview_batches(open_sources(config)[1], batch_size, config.seed, train=False, count=limit)


def _latencies(predict: Any, images: np.ndarray, warmup: int, calls: int) -> list[float]:
    for _ in range(warmup):
        predict(images)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        predict(images)
        samples.append(time.perf_counter() - start)
    return samples


def _throughput(predict: Any, batches: list[HostBatch], batch: int, calls: int) -> dict[str, float]:
    images = np.concatenate([b[0] for b in batches])[:batch]
    if len(images) < batch:  # a small eval split: repeat its images to fill the batch
        images = np.resize(images, (batch, *images.shape[1:]))
    times = summarize(_latencies(predict, images, 1, calls))
    return {"images_per_s": batch / times["median"], "median_ms": 1e3 * times["median"]}


def measure_variant(framework: str, name: str, config: RunConfig, weights: str | None,
                    options: dict[str, Any]) -> dict[str, Any]:
    """One variant: build it, time batch 1 and the throughput batches, score the eval split. A variant that means
    nothing for the model's family (its workload's ``no_inference``: folding a model without BatchNorm) is skipped
    with the workload's reason, before anything is built."""
    row: dict[str, Any] = {"framework": framework, "variant": name}
    meaningless = workload_for(config.model).no_inference.get(name)
    if meaningless:
        return {**row, "status": "skipped", "note": meaningless}
    inference = module(framework, "inference")
    arch = describe(config, num_classes(config))
    batches = eval_batches(config, 128, options["eval_batches"])
    calibration = [images for images, _ in eval_batches(config.replace(seed=config.seed + 1), 32,
                                                        options["calibration_batches"])]
    try:
        predict, note = inference.build(name, config, arch, weights, calibration)
    except inference.Unavailable as exc:
        return {**row, "status": "skipped", "note": str(exc)}
    row["note"] = note
    single = batches[0][0][:1]
    start = time.perf_counter()
    predict(single)
    row["first_call_s"] = time.perf_counter() - start  # includes compilation for compiled variants
    b1 = summarize(_latencies(predict, single, options["warmup"], options["calls"]))
    row["latency_b1_ms"] = {"p50": 1e3 * b1["median"], "p99": 1e3 * b1["p99"], "min": 1e3 * b1["min"], "n": b1["n"]}
    row["throughput"] = {str(batch): _throughput(predict, batches, batch, options["throughput_calls"])
                         for batch in options["throughput_batches"]}
    correct = seen = 0
    for images, labels in batches:
        correct += int((predict(images).argmax(1) == labels).sum())
        seen += len(labels)
    row.update({"status": "ok", "accuracy": correct / seen, "eval_samples": seen,
                "eval_batches": options["eval_batches"]})
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
    reference = next((r for r in rows if r["variant"] == "eager" and r["status"] == "ok"), None)
    for row in rows:
        if reference is not None and row.get("status") == "ok":
            row["accuracy_delta"] = row["accuracy"] - reference["accuracy"]
    return {"status": "ok", "rows": rows, "device": device_name(payload["framework"])}


def train_weights(config: RunConfig, epochs: int, out: Path, timeout_s: float | None) -> tuple[str, dict[str, Any]]:
    """Trains the model with the torch trainer (isolated) and returns its final weights (torch-keyed .npz)."""
    path = out / "weights" / f"trained-{config.model}-w{config.width}-e{epochs}-s{config.seed}.npz"
    if path.exists():
        return str(path), {"reused": str(path)}
    trained = paired_config(config.replace(steps=None, epochs=epochs, save_weights=str(path), eval_batches=None),
                            out / "weights")
    result: RunResult = run_framework(TRAINER, trained, timeout_s)
    if not result.ok:
        raise RuntimeError(f"training the model to infer with failed: {result.error or result.status}")
    return str(path), {"epochs": epochs, "train_accuracy_eval": result.eval.accuracy if result.eval else None}


def infer_rows(framework: str, config: RunConfig, weights: str | None, variants: list[str], options: InferOptions,
               training: dict[str, Any], timeout_s: float | None) -> list[dict[str, Any]]:
    """Every variant of ``framework`` in its own process, as the store's "infer" rows (a crashed process fails
    every variant it held)."""
    result = run_isolated("infer", {"framework": framework, "config": config.to_dict(), "weights": weights,
                                    "variants": list(variants), "options": options.to_dict()}, timeout_s=timeout_s)
    failed = {"framework": framework, "status": "failed", "error": result.get("error")}
    rows = result.get("rows") or [{**failed, "variant": v} for v in variants]
    return [{"key": f"infer/{framework}/{row['variant']}", "command": "infer", "config": config.to_dict(),
             "weights": weights, "training": training, "device": result.get("device"), "host": host_info(),
             "options": options.to_dict(), **{k: v for k, v in row.items() if k != "traceback"}} for row in rows]
