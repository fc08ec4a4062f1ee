"""``twinrun loader-bench``: images/s of each framework's loader over worker counts, with and without PNG
decode, median of repeats (each (framework, png) cell in its own process: experiments/execution/loader_bench.py)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from common.results import ResultStore
from experiments.execution.frameworks import selected
from experiments.execution.loader_bench import BenchOptions, bench_rows, data_path
from experiments.options import add_framework_argument

PNG_CHOICES = {"both": (False, True), "yes": (True,), "no": (False,)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--source", default="cifar100",
                        help="cifar100, cifar10, tfds:cifar100, tfds:cifar10, synthetic")
    parser.add_argument("--data", default=None, help="archive or folder; default: a generated CIFAR-format archive")
    parser.add_argument("--workers", type=_int_list, default=[0, 1, 2], help="comma-separated worker counts")
    parser.add_argument("--png", choices=tuple(PNG_CHOICES), default="both", help="PNG-encode images (decode-bound)")
    parser.add_argument("-b", "--batch-size", type=_positive_int, default=128)
    parser.add_argument("--batches", type=_positive_int, default=12, help="batches per repeat; the first is not timed")
    parser.add_argument("--repeats", type=_positive_int, default=3)
    parser.add_argument("--prefetch", type=_positive_int, default=2)
    parser.add_argument("--pin-mem", action="store_true")
    parser.add_argument("--device-prefetch", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default="results/loader-bench")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"worker counts must be 0 or more, got '{text}'")
    return values


def _table(rows: list[dict[str, Any]], args: argparse.Namespace) -> Table:
    table = Table(title=f"loader throughput, images/s (median of {args.repeats}, batch {args.batch_size}, "
                        f"{args.batches - 1} timed batches after the first)")
    for column in ("framework", "png decode", "workers", "images/s", "p10..p90", "first batch s"):
        table.add_column(column)
    for row in rows:
        if row["status"] != "ok":
            table.add_row(row["framework"], str(row["png"]), "-", "failed", "", "")
            continue
        rate = row["images_per_s"]
        table.add_row(row["framework"], "yes" if row["png"] else "no", str(row["workers"]), f"{rate['median']:.0f}",
                      f"{rate['p10']:.0f}..{rate['p90']:.0f}", f"{row['first_batch_s']['median']:.2f}")
    return table


def run(args: argparse.Namespace) -> int:
    options = BenchOptions(source=args.source, path=data_path(args.source, args.data), workers=tuple(args.workers),
                           batch_size=args.batch_size, batches=args.batches, repeats=args.repeats,
                           prefetch=args.prefetch, pin_memory=args.pin_mem, device_prefetch=args.device_prefetch)
    store = ResultStore(f"{args.out}/runs.jsonl")
    console = Console()
    rows: list[dict[str, Any]] = []
    for framework in selected(args.framework):
        for png in PNG_CHOICES[args.png]:
            console.print(f"[bold]loader-bench[/] {framework} png={png} workers={args.workers}")
            cell = bench_rows(framework, png, options, args.timeout)
            if cell[0]["status"] != "ok":
                console.print(f"[red]failed[/]: {cell[0]['error']}")
            rows += cell
    store.add_many(rows)
    console.print(_table(rows, args))
    console.print(f"rows written to {store.path}")
    return 0
