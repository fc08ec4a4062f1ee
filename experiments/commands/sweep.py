"""``twinrun sweep TECHNIQUE``: one technique's knob over several values, both frameworks, the ladder's
rows and report. Everything else stays at the preset's baseline (fp32, eager unless the sweep is about
compilation), so each sweep isolates its technique."""

from __future__ import annotations

import argparse
import time

from experiments.catalog.presets import model_tag
from experiments.catalog.sweeps import COMPILE_OPTIONS, SWEEPS, checked_values
from experiments.execution.device import cuda_available
from experiments.execution.plan import (
    Configuration,
    PlannedRun,
    execute,
    outcome_line,
    prepare,
    sweep_plan,
    sweep_repeat,
    with_paired_weights,
)
from experiments.execution.record import RunRecord
from experiments.options import adaptive_options, add_plan_arguments, console_for_output, plan_options
from experiments.reporting.analysis import analyse, references, sweep_pairs
from experiments.reporting.cells import sweep_cells
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("technique", choices=tuple(SWEEPS), help="the technique whose knob is swept")
    group = parser.add_argument_group("sweep")
    group.add_argument("--values", nargs="+", default=None,
                       help="values, e.g. --values none 3,4 all (default: per technique)")
    group.add_argument("--compile", choices=COMPILE_OPTIONS, default="native",
                       help="mode of both frameworks outside the compile-mode sweep; native (default): torch eager, "
                            "JAX jit, how each is normally run (op-by-op JAX is dispatch-bound and hides every "
                            "technique)")
    add_plan_arguments(parser, "sweep-<technique>-<preset>[-<model>]")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    sweep = SWEEPS[args.technique]
    prepared = prepare(plan_options(args), f"sweep-{sweep.name}-{args.preset}{model_tag(args.preset, args.model)}")
    values = checked_values(sweep, args.values or sweep.default_values(prepared.base, cuda_available()),
                            prepared.base, prepared.frameworks)
    console = console_for_output()
    with prepared.store.locked(f"sweep {sweep.name}", "another --name or --results"):
        prepared = with_paired_weights(prepared)  # every value is valid: now the shared initial weights
        plan = sweep_plan(sweep, values, prepared.base, prepared.frameworks, args.repeats, args.preset, args.compile,
                          args.order_seed, control=prepared.control)

        def undecided(records: list[RunRecord]) -> set[Configuration]:
            cells = sweep_cells(records)
            return analyse(cells, sweep_pairs(cells, references(records))).needs_more(args.precision)

        def repeat(number: int, only: set[Configuration]) -> list[PlannedRun]:
            return sweep_repeat(sweep, values, prepared.base, prepared.frameworks, number, f"{number + 1} (adaptive)",
                                args.preset, args.compile, only, control=prepared.control)

        outcome = execute(plan, prepared.store, prepared.out.name, args.timeout, console, fresh=args.fresh,
                          adaptive=adaptive_options(args, undecided, repeat, started))
        report = write_report(prepared.out)
    console.print(report.table)
    console.print(f"rows: {prepared.store.path} (exports: {prepared.store.jsonl.name}, {prepared.store.csv.name})\n"
                  f"report: {report.path}\n{outcome_line(outcome)}")
    return 0 if outcome.complete else 1
