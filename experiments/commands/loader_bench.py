"""``twinrun loader-bench``: images/s of each framework's loader over worker counts, with and without PNG
decode, median of repeats (each (framework, png) cell in its own process: experiments/execution/loader_bench.py)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from common.data.sources import KNOWN_SOURCES
from experiments.cli import help_of
from experiments.execution.frameworks import selected
from experiments.execution.loader_bench import BenchOptions, bench_rows, data_path
from experiments.execution.store import ResultStore
from experiments.options import add_framework_argument, add_timeout_argument, int_list, nonnegative_int, positive_int

PNG_CHOICES = {"both": (False, True), "yes": (True,), "no": (False,)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    data = parser.add_argument_group("data")
    data.add_argument("--source", default="cifar100", choices=KNOWN_SOURCES, help="data set")
    data.add_argument("--data", default=None, help="archive or folder; default: a generated CIFAR-format archive")
    data.add_argument("--png", choices=tuple(PNG_CHOICES), default="both", help="PNG-encode images (decode-bound)")
    loader = parser.add_argument_group("loader")
    loader.add_argument("--workers", type=int_list, default=[0, 1, 2], metavar="N[,N...]",
                        help="comma-separated worker counts")
    loader.add_argument("-b", "--batch-size", type=positive_int, default=128, help="images per batch")
    loader.add_argument("--batches", type=_two_or_more, default=12, help="batches per repeat; the first is not timed")
    loader.add_argument("--repeats", type=positive_int, default=3, help="repeats of each cell (the median is shown)")
    loader.add_argument("--prefetch", type=positive_int, default=2, help=help_of("prefetch", default=False))
    loader.add_argument("--pin-mem", action="store_true", help=help_of("pin_mem", default=False))
    loader.add_argument("--device-prefetch", type=nonnegative_int, default=2,
                        help=help_of("device_prefetch", default=False))
    output = parser.add_argument_group("output")
    add_timeout_argument(output, 900.0, "each (framework, png) cell")
    output.add_argument("--out", default="results/loader-bench", help="folder of runs.jsonl")


def _two_or_more(text: str) -> int:
    """--batches: the first batch of a repeat is timed apart, so a steady state needs a second."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be 2 or more (the first batch is not timed), got {text}")
    return value


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
    store = ResultStore(args.out)
    store.check_writable()
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
    console.print(f"rows written to {store.path} (exports: {store.jsonl.name}, {store.csv.name})")
    return 0 if all(row["status"] == "ok" for row in rows) else 1
