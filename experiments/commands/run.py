"""``twinrun run``: one configuration, both frameworks (or one), paired initial weights, a side-by-side table."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.table import Table

from common.config import RunConfig
from common.workloads import workload_for
from experiments.catalog.defaults import with_default_data
from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.frameworks import selected
from experiments.execution.host import host_info
from experiments.execution.paired import paired_config, run_framework
from experiments.execution.preflight import check_runnable
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore
from experiments.options import add_framework_argument, add_timeout_argument, console_for_output
from experiments.reporting.tables import augmentation_text

COLUMNS = ("framework", "status", "step ms (p10..p90)", "images/s", "data wait %", "first step s", "recompiles",
           "final loss", "accuracy", "notes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--out", default="results/run", help="folder of runs.jsonl and the paired weights")
    add_timeout_argument(parser, 3600.0, "each framework's run")
    add_config_arguments(parser)


def table_row(record: RunRecord, timing_warmup: int) -> list[str]:
    """One framework's line of the side-by-side table."""
    result, timing = record.result, record.result.timing
    if not result.ok:
        return [record.framework, result.status, "", "", "", "", "", "", "", str(result.error or "")[:200]]
    accuracy = "-" if result.eval is None else f"{result.eval.accuracy:.3f}"
    accuracy = "n/a (synthetic)" if result.synthetic_data else accuracy
    head = [record.framework, "ok"]
    tail = [f"{timing.first_step_s:.2f}", str(result.recompiles), f"{result.final_loss:.4f}", accuracy]
    if timing.step_s is None:  # every step was a warm-up step: nothing steady to show
        return [*head, "-", "-", "-", *tail, f"no timed steps: steps <= timing_warmup ({timing_warmup})"]
    step = timing.step_s
    return [*head, f"{step.median * 1e3:.1f} ({step.p10 * 1e3:.1f}..{step.p90 * 1e3:.1f})",
            f"{timing.images_per_s:.0f}", f"{100 * timing.data_wait_fraction:.1f}", *tail, "; ".join(result.notes)]


def _title(config: RunConfig, records: list[RunRecord]) -> str:
    model = workload_for(config.model).summary(config)  # a ResNet's width multiplier; a ViT's shape and kernel
    return (f"{model} batch={config.batch_size} precision={config.precision} compile={config.compile} augmentation="
            f"{augmentation_text([r.result for r in records])}: median step over "
            f"{records[0].result.timing.timed_steps} timed steps after {config.timing_warmup} warm-up (synchronized)")


def run(args: argparse.Namespace) -> int:
    config = with_default_data(config_from_args(args))
    frameworks = selected(args.framework, config.model)
    check_runnable(config, frameworks)
    out = Path(args.out)
    store = ResultStore(out)
    store.check_writable()
    console = console_for_output()
    records = []
    with store.locked("run", "another --out"):
        config = paired_config(config, out / "weights")
        for framework in frameworks:
            console.print(f"[bold]run[/] {framework} ...")
            started = time.time()
            result = run_framework(framework, config, args.timeout)
            # keyed to the millisecond: two runs started within one second no longer share a key (and a row)
            record = RunRecord(key=f"run/{framework}/{int(started * 1000)}", command="run", result=result,
                               config=config.to_dict(), host=host_info(), wall_s=time.time() - started)
            records.append(record)
            store.add(record.to_row())
    table = Table(title=_title(config, records))
    for column in COLUMNS:
        table.add_column(column)
    for record in records:
        table.add_row(*table_row(record, config.timing_warmup))
    console.print(table)
    return 0 if all(r.status == "ok" for r in records) else 1
