"""``twinrun ladder``: the case study's rungs, one technique added at a time, in both frameworks."""

from __future__ import annotations

import argparse

from experiments.catalog.rungs import default_loader_workers
from experiments.execution.device import cuda_available
from experiments.execution.plan import execute, ladder_plan, outcome_line, prepare, with_paired_weights
from experiments.options import add_plan_arguments, console_for_output, nonnegative_int, plan_options
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser, "ladder-<preset>")
    parser.add_argument_group("ladder").add_argument(
        "--workers", type=nonnegative_int, default=None,
        help="the loader rung's worker count (default: CPU count, at most 8)")
    # test hook: make one run die, to show that the ladder records it failed and goes on
    parser.add_argument("--inject-failure", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    prepared = with_paired_weights(prepare(plan_options(args), f"ladder-{args.preset}"))
    workers = args.workers if args.workers is not None else default_loader_workers()
    plan = ladder_plan(prepared, args.repeats, args.preset, workers, cuda_available(), args.inject_failure)
    console = console_for_output()
    outcome = execute(plan, prepared.store, "ladder", args.timeout, console, fresh=args.fresh)
    report = write_report(prepared.out)
    console.print(report.table)
    console.print(f"rows: {prepared.store.path} (exports: {prepared.store.jsonl.name}, {prepared.store.csv.name})\n"
                  f"report: {report.path}\n{outcome_line(outcome)}")
    return 0 if outcome.complete else 1
