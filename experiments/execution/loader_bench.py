"""Images/s of each framework's loader over worker counts, with and without PNG decode, median of repeats.
Each (framework, png) cell runs in its own process; the rows are "loader-bench" rows of a store."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from common.config import RunConfig
from common.data import load_source
from common.timing import summarize
from common.workloads import loader_options
from experiments.catalog.defaults import default_archive
from experiments.execution.frameworks import LOADER_PACKAGES, module
from experiments.execution.host import host_info, package_versions
from experiments.execution.runner import run_isolated

CIFAR_SOURCES = ("cifar100", "cifar10")


@dataclass(frozen=True)
class BenchOptions:
    source: str
    path: str | None
    workers: tuple[int, ...]
    batch_size: int
    batches: int  # per repeat; the first is timed apart (start-up)
    repeats: int
    prefetch: int
    pin_memory: bool
    device_prefetch: int


def data_path(source: str, path: str | None) -> str | None:
    """The data to read, checked once here (a missing or corrupt data set is one clear error, not N failed rows);
    the generated archive of a CIFAR source if none is given."""
    if source in CIFAR_SOURCES and path is None:
        path = str(default_archive(source))
    load_source(source, "train", path)
    return path


def measure_in_process(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs inside the isolated worker: times every worker count for one framework and PNG setting."""
    framework = payload["framework"]
    data = module(framework, "data")
    source = load_source(payload["source"], "train", payload.get("path"), png=payload["png"],
                         **payload.get("source_opts", {}))
    cells = []
    for workers in payload["workers"]:
        knobs = RunConfig(batch_size=payload["batch_size"], workers=workers, prefetch=payload["prefetch"],
                          pin_mem=payload["pin_memory"], device_prefetch=payload["device_prefetch"])
        options = loader_options(knobs, train=True)  # the loader a run with these knobs reads
        loader = data.make_loader(source, options, train=True)
        rates, startups = [], []
        for repeat in range(payload["repeats"]):
            # Each repeat is a new epoch: a new order of the same work; the first batch (worker start-up,
            # first transfer) is timed apart from the steady state.
            startup, times = data.time_loader(loader, epoch=repeat, max_batches=payload["batches"])
            if not times:
                raise ValueError("need at least 2 batches per repeat to time a steady state; raise --batches or "
                                 "lower --batch-size")
            rates.append(payload["batch_size"] * len(times) / sum(times))
            startups.append(startup)
        cells.append({"workers": workers, "images_per_s": summarize(rates), "first_batch_s": summarize(startups)})
    return {"status": "ok", "cells": cells, "versions": package_versions(LOADER_PACKAGES[framework])}


def bench_rows(framework: str, png: bool, options: BenchOptions, timeout_s: float | None) -> list[dict[str, Any]]:
    """One (framework, png) cell in its own process, as rows: one per worker count, or one failed row."""
    payload = {"framework": framework, "png": png, **asdict(options), "workers": list(options.workers)}
    result = run_isolated("loader-bench", payload, timeout_s=timeout_s)
    base = {"command": "loader-bench", "framework": framework, "png": png, "source": options.source,
            "batch_size": options.batch_size, "host": host_info()}
    if result["status"] != "ok":
        return [{**base, "key": f"loader-bench/{framework}/png={png}", "status": "failed", "error": result["error"]}]
    return [{**base, **cell, "key": f"loader-bench/{framework}/png={png}/workers={cell['workers']}", "status": "ok",
             "versions": result["versions"]} for cell in result["cells"]]
