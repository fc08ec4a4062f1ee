"""``twinrun infer``: inference variants in both frameworks, each with its latency beside its accuracy.

Per framework (one isolated process each), per variant (eager, compiled, folded, int8, onnxruntime,
tensorrt): batch-1 latency p50/p99 over timed calls after warm-up (the first call, with compilation, kept
apart), throughput at batch 32 and 128, and accuracy on the eval split with its delta against the same
framework's eager fp32. Every call is host batch in -> host logits out (synchronized). Both frameworks
load the same weights: trained by the torch trainer for ``--train-epochs`` (default) or given by
``--weights``; with ``--train-epochs 0`` and no weights, torch's random initialisation.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.config import (
    INFERENCE_VARIANTS,
    RunConfig,
    add_config_arguments,
    config_from_args,
    open_sources,
)
from common.errors import ConfigError
from common.results import ResultStore
from common.timing import summarize
from common.versions import host_info


def _eval_batches(config: RunConfig, batch_size: int, limit: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    from common.data.batches import preview_batches

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


def measure_variant(framework: str, name: str, config: RunConfig, weights: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """One variant: build it, time batch 1 and the throughput batches, score the eval split."""
    module = importlib.import_module(f"{framework}_impl.inference")
    arch = config.arch(open_sources(config)[0].num_classes)
    eval_batches = _eval_batches(config, 128, options["eval_batches"])
    calibration = [images for images, _ in _eval_batches(config.replace(seed=config.seed + 1), 32, options["calibration_batches"])]
    row: dict[str, Any] = {"framework": framework, "variant": name}
    try:
        predict, note = module.build(name, config, arch, weights, calibration)
    except module.Unavailable as exc:
        return {**row, "status": "skipped", "note": str(exc)}
    row["note"] = note
    single = eval_batches[0][0][:1]
    start = time.perf_counter()
    predict(single)
    row["first_call_s"] = time.perf_counter() - start  # includes compilation for compiled variants
    b1 = summarize(_latencies(predict, single, options["warmup"], options["calls"]))
    row["latency_b1_ms"] = {"p50": 1e3 * b1["median"], "p99": 1e3 * b1["p99"], "min": 1e3 * b1["min"], "n": b1["n"]}
    row["throughput"] = {}
    for batch in options["throughput_batches"]:
        images = np.concatenate([b[0] for b in eval_batches])[:batch]
        if len(images) < batch:  # a small eval split: repeat its images to fill the batch
            images = np.resize(images, (batch, *images.shape[1:]))
        times = summarize(_latencies(predict, images, 1, options["throughput_calls"]))
        row["throughput"][str(batch)] = {"images_per_s": batch / times["median"], "median_ms": 1e3 * times["median"]}
    correct = seen = 0
    for images, labels in eval_batches:
        correct += int((predict(images).argmax(1) == labels).sum())
        seen += len(labels)
    row.update({"status": "ok", "accuracy": correct / seen, "eval_samples": seen, "eval_batches": options["eval_batches"]})
    return row


def measure_in_process(payload: dict[str, Any]) -> dict[str, Any]:
    """Every requested variant of one framework, in this process (a failure fails that variant only)."""
    import traceback

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
    return {"status": "ok", "rows": rows, "device": _device_name(payload["framework"])}


def _device_name(framework: str) -> str:
    if framework == "torch":
        from torch_impl.data import default_device

        return str(default_device())
    import jax

    return str(jax.devices()[0])


def train_weights(config: RunConfig, epochs: int, out: Path, timeout_s: float | None) -> tuple[str, dict[str, Any]]:
    """Trains the model with the torch trainer (isolated) and returns its final weights (torch-keyed .npz)."""
    from experiments.paired import paired_config, run_framework

    path = out / "weights" / f"trained-{config.model}-w{config.width}-e{epochs}-s{config.seed}.npz"
    if path.exists():
        return str(path), {"reused": str(path)}
    trained = paired_config(config.replace(steps=None, epochs=epochs, save_weights=str(path), eval_batches=None), out / "weights")
    result = run_framework("torch", trained, timeout_s)
    if result.get("status") != "ok":
        raise RuntimeError(f"training the model to infer with failed: {result.get('error', result.get('status'))}")
    return str(path), {"epochs": epochs, "train_accuracy_eval": result.get("eval", {}).get("accuracy")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--variants", nargs="+", default=list(INFERENCE_VARIANTS), choices=INFERENCE_VARIANTS)
    parser.add_argument("--weights", default=None, help="torch-keyed .npz of trained weights (BN statistics included)")
    parser.add_argument("--train-epochs", type=int, default=3, help="train with the torch trainer first (0: random weights)")
    parser.add_argument("--calls", type=int, default=100, help="timed batch-1 calls (p99 needs >= 100)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--throughput-batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--throughput-calls", type=int, default=10)
    parser.add_argument("--calibration-batches", type=int, default=8, help="INT8 calibration: batches of 32 images")
    parser.add_argument("--out", default="results/infer")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0)
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from experiments.defaults import with_default_data
    from experiments.paired import FRAMEWORKS
    from experiments.plan import console_for_output
    from experiments.report import write_report
    from experiments.runner import run_isolated

    config = config_from_args(args)
    config = with_default_data(config)
    if args.weights and not Path(args.weights).is_file():
        raise ConfigError(f"weights file not found: {args.weights}")
    out = Path(args.out)
    store = ResultStore(out / "runs.jsonl")
    if args.fresh:
        store.clear()
    console = console_for_output()
    weights, training = args.weights, {"weights": args.weights or "random (torch init)"}
    if weights is None and args.train_epochs > 0:
        console.print(f"[bold]infer[/]: training {config.model} width {config.width} for {args.train_epochs} epochs (torch) ...")
        weights, training = train_weights(config, args.train_epochs, out, args.timeout)
    options = {"calls": args.calls, "warmup": args.warmup, "throughput_batches": args.throughput_batches,
               "throughput_calls": args.throughput_calls, "calibration_batches": args.calibration_batches,
               "eval_batches": config.eval_batches}
    for framework in FRAMEWORKS if args.framework == "both" else (args.framework,):
        console.print(f"[bold]infer[/] {framework}: {', '.join(args.variants)} ...")
        result = run_isolated("infer", {"framework": framework, "config": config.to_dict(), "weights": weights,
                                        "variants": list(args.variants), "options": options}, timeout_s=args.timeout)
        rows = result.get("rows") or [{"framework": framework, "variant": v, "status": "failed", "error": result.get("error")}
                                      for v in args.variants]
        store.add_many([{"key": f"infer/{framework}/{row['variant']}", "command": "infer", "config": config.to_dict(),
                         "weights": weights, "training": training, "device": result.get("device"), "host": host_info(),
                         "options": options, **{k: v for k, v in row.items() if k != "traceback"}} for row in rows])
    report = write_report(out, console=console)
    console.print(f"rows: {store.path}\nreport: {report}")
    return 0
