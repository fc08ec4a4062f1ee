"""``twinrun infer``: inference variants in both frameworks, each with its latency beside its accuracy.

Per framework (one isolated process each), per variant (eager, compiled, folded, int8, onnxruntime,
tensorrt): batch-1 latency p50/p99 over timed calls after warm-up (the first call, with compilation, kept
apart), throughput at batch 32 and 128, and accuracy on the eval split with its delta against the same
framework's eager fp32 (experiments/execution/inference.py). Both frameworks load the same weights: trained
by the torch trainer for ``--train-epochs`` (default) or given by ``--weights``; with ``--train-epochs 0`` and
no weights, torch's random initialisation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_config_arguments, config_from_args
from common.config import INFERENCE_VARIANTS
from common.errors import ConfigError
from common.results import ResultStore
from experiments.catalog.defaults import with_default_data
from experiments.execution.frameworks import selected
from experiments.execution.inference import InferOptions, infer_rows, train_weights
from experiments.options import add_framework_argument, console_for_output
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--variants", nargs="+", default=list(INFERENCE_VARIANTS), choices=INFERENCE_VARIANTS)
    parser.add_argument("--weights", default=None, help="torch-keyed .npz of trained weights (BN statistics included)")
    parser.add_argument("--train-epochs", type=int, default=3,
                        help="train with the torch trainer first (0: random weights)")
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
    config = with_default_data(config_from_args(args))
    if args.weights and not Path(args.weights).is_file():
        raise ConfigError(f"weights file not found: {args.weights}")
    out = Path(args.out)
    store = ResultStore(out / "runs.jsonl")
    if args.fresh:
        store.clear()
    console = console_for_output()
    weights, training = args.weights, {"weights": args.weights or "random (torch init)"}
    if weights is None and args.train_epochs > 0:
        console.print(f"[bold]infer[/]: training {config.model} width {config.width} for {args.train_epochs} epochs "
                      f"(torch) ...")
        weights, training = train_weights(config, args.train_epochs, out, args.timeout)
    options = InferOptions(calls=args.calls, warmup=args.warmup, throughput_batches=tuple(args.throughput_batches),
                           throughput_calls=args.throughput_calls, calibration_batches=args.calibration_batches,
                           eval_batches=config.eval_batches)
    for framework in selected(args.framework):
        console.print(f"[bold]infer[/] {framework}: {', '.join(args.variants)} ...")
        store.add_many(infer_rows(framework, config, weights, args.variants, options, training, args.timeout))
    report = write_report(out)
    console.print(report.table)
    console.print(f"rows: {store.path}\nreport: {report.path}")
    return 0
