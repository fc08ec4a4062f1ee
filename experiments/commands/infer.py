"""``twinrun infer``: inference variants in both frameworks, each with its latency beside its accuracy.

Per framework (one isolated process each), per variant (eager, compiled, folded, int8, int4, onnxruntime,
tensorrt): batch-1 latency p50/p99 over timed calls, each on the next eval example, after warm-up (the first
call and every other distinct input shape, with their compilation, kept apart), throughput at batch 32 and 128,
and accuracy on the eval split with its delta against the same framework's eager fp32
(experiments/execution/inference.py). A text model (``--model text-*``) reads its inputs from the shared batch
maker, padded per ``--batching``: batch 1 runs over the eval texts' real lengths, and a compiled variant compiles
one program per padded shape (the row's note counts them). Here a text model's batching defaults to ``bucket``
(a few padded lengths, as a server batches), not RunConfig's ``pad-longest``: over the 100 batch-1 calls that is 65
lengths, and JAX, eager as jitted, compiles for each (the JAX eager variant's warm-up alone took 154 s on 2 CPU
cores; with buckets, 5 shapes, 8 s). ``--batching pad-longest`` measures that cost. Both frameworks load the same
weights: trained by the torch trainer for ``--train-epochs`` (default) or given by ``--weights``; with
``--train-epochs 0`` and no weights, torch's random initialisation. A variant that cannot run here (INT4 without
torchao / qwix, TensorRT without CUDA, no BatchNorm to fold) is a skipped row that says why.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from common.config import RunConfig
from common.inference import VARIANTS as INFERENCE_VARIANTS
from common.workloads import workload_for
from experiments.catalog.defaults import with_default_data
from experiments.cli import add_config_arguments, config_from_args, given_keys
from experiments.execution.frameworks import selected
from experiments.execution.host import host_info
from experiments.execution.inference import InferOptions, infer_rows, train_weights, trained_weights_path
from experiments.execution.preflight import check_runnable, check_weights_file
from experiments.execution.store import ResultStore, run_settings
from experiments.options import (
    add_framework_argument,
    add_timeout_argument,
    console_for_output,
    nonnegative_int,
    plural,
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


def _origin(args: argparse.Namespace) -> str:
    """Where the weights come from, as the rows' settings record it (a rerun must match it to resume)."""
    if args.weights:
        return f"given: {args.weights}"
    return f"trained {args.train_epochs} epochs (torch)" if args.train_epochs else "random (torch init)"


def _weights(args: argparse.Namespace, config: RunConfig, out: Path, console: Any) -> tuple[str | None, dict]:
    """The weights both frameworks infer with: given, trained now, reused from an earlier run's training (said
    as such, never as training), or none (torch's random initialisation)."""
    if args.weights or args.train_epochs == 0:
        return args.weights, {"weights": _origin(args)}
    path = trained_weights_path(config, args.train_epochs, out)
    if path.exists():
        console.print(f"[bold]infer[/]: reusing the weights trained earlier for {plural(args.train_epochs, 'epoch')}: "
                      f"{path}")
    else:
        model = workload_for(config.model).summary(config)
        console.print(f"[bold]infer[/]: training {model} for {plural(args.train_epochs, 'epoch')} (torch) ...")
    return train_weights(config, args.train_epochs, out, args.timeout)


TEXT_BATCHING = "bucket"  # a text model's batching here, unless given (the module's docstring says why)


def inference_config(args: argparse.Namespace) -> RunConfig:
    """The run config of the command line, with infer's own default for a text model's batching."""
    config = with_default_data(config_from_args(args))
    if workload_for(config.model).family == "text" and "batching" not in given_keys(args):
        config = config.replace(batching=TEXT_BATCHING)
    return config


def run(args: argparse.Namespace) -> int:
    config = inference_config(args)
    if args.weights:
        check_weights_file(args.weights, "--weights")
    trains = not args.weights and args.train_epochs > 0
    check_runnable(config, ("torch",) if trains else ())  # the torch trainer makes the weights
    out = Path(args.out)
    store = ResultStore(out)
    store.check_writable()
    frameworks = selected(args.framework, config.model)
    options = InferOptions(calls=args.calls, warmup=args.warmup, throughput_batches=tuple(args.throughput_batches),
                           throughput_calls=args.throughput_calls, calibration_batches=args.calibration_batches,
                           eval_batches=config.eval_batches, weights_from=_origin(args))
    console = console_for_output()
    settings = run_settings(config.to_dict(), host_info(), options.to_dict())  # rows of others: refused
    with store.locked("infer", "another --out"):
        moved = store.start({f"infer/{f}/{v}": settings for f in frameworks for v in args.variants}, args.fresh,
                            other="another --out")
        if moved:
            console.print(f"earlier results moved to {moved}")
        finished = store.finished()
        todo = {f: [v for v in args.variants if f"infer/{f}/{v}" not in finished] for f in frameworks}
        kept = [f"{f}/{v}" for f in frameworks for v in args.variants if f"infer/{f}/{v}" in finished]
        if kept:
            console.print(f"[bold]infer[/]: kept {len(kept)} variant(s) measured earlier with the same settings, not "
                          f"measured again: {', '.join(kept)}")
        failed = _measure(args, config, out, todo, finished, options, store, console) if any(todo.values()) else []
        report = write_report(out)
    console.print(report.table)
    for row in failed:
        console.print(f"[red]{row['key']} failed[/]: {str(row.get('error'))[:300]}")
    ending = f"{len(failed)} variant(s) failed" if failed else "every variant ran (or was skipped with its reason)"
    console.print(f"rows: {store.path}\nreport: {report.path}\n{ending}")
    return 1 if failed else 0


def _measure(args: argparse.Namespace, config: RunConfig, out: Path, todo: dict[str, list[str]],
             finished: dict[str, dict], options: InferOptions, store: ResultStore, console: Any) -> list[dict]:
    """The variants still to measure, per framework (each framework's process), stored as they end; returns the
    rows that failed. A variant's accuracy delta reads the same framework's eager row, measured now or before."""
    weights, training = _weights(args, config, out, console)
    failed = []
    for framework, variants in todo.items():
        if not variants:
            continue
        console.print(f"[bold]infer[/] {framework}: {', '.join(variants)} ...")
        reference = finished.get(f"infer/{framework}/eager", {}).get("accuracy")
        rows = infer_rows(framework, config, weights, variants, options, training, args.timeout, reference)
        failed += [row for row in rows if row["status"] == "failed"]
        for row in store.add_many(rows):
            console.print(f"[yellow]{row['key']}[/] failed this time; the earlier finished row is kept")
    return failed
