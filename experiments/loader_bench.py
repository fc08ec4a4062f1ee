"""``twinrun loader-bench``: images/s of each framework's loader over worker counts, with and without
PNG decode, median of repeats. Each (framework, png) cell runs in its own process."""

from __future__ import annotations

import argparse
from typing import Any

from common.data import load_source
from common.data.loader_options import LoaderOptions
from common.results import ResultStore
from common.timing import summarize
from common.versions import host_info, package_versions


def measure_in_process(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs inside the isolated worker: times every worker count for one framework and PNG setting."""
    framework = payload["framework"]
    if framework == "torch":
        from torch_impl.data import make_loader, time_loader
    else:
        from jax_impl.data import make_loader, time_loader
    source = load_source(payload["source"], "train", payload.get("path"), png=payload["png"], **payload.get("source_opts", {}))
    cells = []
    for workers in payload["workers"]:
        options = LoaderOptions(batch_size=payload["batch_size"], workers=workers, prefetch=payload["prefetch"],
                                pin_memory=payload["pin_memory"], device_prefetch=payload["device_prefetch"], seed=0)
        loader = make_loader(source, options, train=True)
        rates, startups = [], []
        for repeat in range(payload["repeats"]):
            # Each repeat is a new epoch: a new order of the same work; the first batch (worker start-up,
            # first transfer) is timed apart from the steady state.
            startup, times = time_loader(loader, epoch=repeat, max_batches=payload["batches"])
            if not times:
                raise ValueError("need at least 2 batches per repeat to time a steady state; raise --batches or lower --batch-size")
            rates.append(payload["batch_size"] * len(times) / sum(times))
            startups.append(startup)
        cells.append({"workers": workers, "images_per_s": summarize(rates), "first_batch_s": summarize(startups)})
    return {"status": "ok", "cells": cells,
            "versions": package_versions(("torch", "jax", "grain") if framework == "jax" else ("torch",))}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.table import Table

    from experiments.defaults import default_archive
    from experiments.runner import run_isolated

    path = args.data
    if args.source in ("cifar100", "cifar10") and path is None:
        path = str(default_archive(args.source))
    # Check the data once here, so a missing or corrupt data set is one clear error, not N failed rows.
    load_source(args.source, "train", path)
    store = ResultStore(f"{args.out}/runs.jsonl")
    frameworks = ("torch", "jax") if args.framework == "both" else (args.framework,)
    pngs = {"both": (False, True), "yes": (True,), "no": (False,)}[args.png]
    rows = []
    console = Console()
    for framework in frameworks:
        for png in pngs:
            payload = {"framework": framework, "source": args.source, "path": path, "png": png,
                       "workers": args.workers, "batch_size": args.batch_size, "batches": args.batches,
                       "repeats": args.repeats, "prefetch": args.prefetch, "pin_memory": args.pin_mem,
                       "device_prefetch": args.device_prefetch}
            console.print(f"[bold]loader-bench[/] {framework} png={png} workers={args.workers}")
            result = run_isolated("loader-bench", payload, timeout_s=args.timeout)
            base = {"command": "loader-bench", "framework": framework, "png": png, "source": args.source,
                    "batch_size": args.batch_size, "host": host_info()}
            if result["status"] != "ok":
                rows.append({**base, "key": f"loader-bench/{framework}/png={png}", "status": "failed", "error": result["error"]})
                console.print(f"[red]failed[/]: {result['error']}")
                continue
            for cell in result["cells"]:
                rows.append({**base, **cell, "key": f"loader-bench/{framework}/png={png}/workers={cell['workers']}",
                             "status": "ok", "versions": result["versions"]})
    store.add_many(rows)
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
    console.print(table)
    console.print(f"rows written to {store.path}")
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--source", default="cifar100", help="cifar100, cifar10, tfds:cifar100, tfds:cifar10, synthetic")
    parser.add_argument("--data", default=None, help="archive or folder; default: a generated CIFAR-format archive")
    parser.add_argument("--workers", type=_int_list, default=[0, 1, 2], help="comma-separated worker counts")
    parser.add_argument("--png", choices=("both", "yes", "no"), default="both", help="PNG-encode images (decode-bound)")
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
