"""``twinrun infer``: inference variants in both frameworks, each with its latency beside its accuracy.

Per framework (one isolated process each), per variant (eager, compiled, folded, int8, int4, onnxruntime,
tensorrt): batch-1 latency p50/p99 over timed calls, each on the next eval example, after warm-up (the first
call and every other distinct input shape, with their compilation, kept apart), throughput at batch 32 and 128,
and accuracy on the eval split with its delta against the same framework's eager fp32
(experiments/execution/inference.py). A text model (``--model text-*``) reads its inputs from the shared batch
maker, padded per ``--batching``: batch 1 runs over the eval texts' real lengths, and a compiled variant compiles
one program per padded shape (bucket keeps them few; the row's note counts them). Both frameworks load the same
weights: trained by the torch trainer for ``--train-epochs`` (default) or given by ``--weights``; with
``--train-epochs 0`` and no weights, torch's random initialisation. A variant that cannot run here (INT4 without
torchao / qwix, TensorRT without CUDA, no BatchNorm to fold) is a skipped row that says why.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_config_arguments, config_from_args
from common.config import INFERENCE_VARIANTS
from common.errors import ConfigError
from common.store import ResultStore, run_settings
from common.versions import host_info
from common.workloads import workload_for
from experiments.catalog.defaults import with_default_data
from experiments.execution.frameworks import selected
from experiments.execution.inference import InferOptions, infer_rows, train_weights
from experiments.options import (
    add_framework_argument,
    add_timeout_argument,
    console_for_output,
    nonnegative_int,
    positive_int,
)
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    group = parser.add_argument_group("inference")
    group.add_argument("--variants", nargs="+", default=list(INFERENCE_VARIANTS), choices=INFERENCE_VARIANTS,
                       metavar="VARIANT", help=f"variants to measure, of: {', '.join(INFERENCE_VARIANTS)}")
    group.add_argument("--weights", default=None, help="torch-keyed .npz of trained weights (BN statistics included)")
    group.add_argument("--train-epochs", type=nonnegative_int, default=3,
                       help="without --weights: train with the torch trainer first (0: random weights)")
    group.add_argument("--calls", type=positive_int, default=100,
                       help="timed batch-1 calls, each on the next eval example (p99 needs >= 100)")
    group.add_argument("--warmup", type=nonnegative_int, default=10,
                       help="untimed batch-1 calls before the timed ones (after the first call and one call on "
                            "every distinct input shape, kept apart)")
    group.add_argument("--throughput-batches", type=positive_int, nargs="+", default=[32, 128], metavar="BATCH",
                       help="batch sizes of the throughput measurement")
    group.add_argument("--throughput-calls", type=positive_int, default=10,
                       help="timed calls per throughput batch size")
    group.add_argument("--calibration-batches", type=positive_int, default=8,
                       help="static INT8 calibration (a ResNet's): batches of 32 images")
    add_timeout_argument(group, 3600.0, "each framework's measurement (and the training)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default="results/infer",
                        help="folder of the results (runs.sqlite, its runs.jsonl/csv exports), the report and weights")
    output.add_argument("--fresh", action="store_true",
                        help="move earlier results to OUT/old/<time>/ and start over (after every check passed)")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = with_default_data(config_from_args(args))
    if args.weights and not Path(args.weights).is_file():
        raise ConfigError(f"weights file not found: {args.weights}")
    out = Path(args.out)
    store = ResultStore(out)
    store.check_writable()
    frameworks = selected(args.framework)
    origin = (f"given: {args.weights}" if args.weights else
              f"trained {args.train_epochs} epochs (torch)" if args.train_epochs else "random (torch init)")
    options = InferOptions(calls=args.calls, warmup=args.warmup, throughput_batches=tuple(args.throughput_batches),
                           throughput_calls=args.throughput_calls, calibration_batches=args.calibration_batches,
                           eval_batches=config.eval_batches, weights_from=origin)
    console = console_for_output()
    settings = run_settings(config.to_dict(), host_info(), options.to_dict())  # rows of others: refused
    moved = store.start({f"infer/{f}/{v}": settings for f in frameworks for v in args.variants}, args.fresh)
    if moved:
        console.print(f"earlier results moved to {moved}")
    weights, training = args.weights, {"weights": origin}
    if weights is None and args.train_epochs > 0:
        model = workload_for(config.model).summary(config)
        console.print(f"[bold]infer[/]: training {model} for {args.train_epochs} epochs "
                      f"(torch) ...")
        weights, training = train_weights(config, args.train_epochs, out, args.timeout)
    failed = []
    for framework in frameworks:
        console.print(f"[bold]infer[/] {framework}: {', '.join(args.variants)} ...")
        rows = infer_rows(framework, config, weights, args.variants, options, training, args.timeout)
        failed += [row for row in rows if row["status"] == "failed"]
        for row in store.add_many(rows):
            console.print(f"[yellow]{row['key']}[/] failed this time; the earlier finished row is kept")
    report = write_report(out)
    console.print(report.table)
    for row in failed:
        console.print(f"[red]{row['key']} failed[/]: {str(row.get('error'))[:300]}")
    ending = f"{len(failed)} variant(s) failed" if failed else "every variant ran (or was skipped with its reason)"
    console.print(f"rows: {store.path}\nreport: {report.path}\n{ending}")
    return 1 if failed else 0
