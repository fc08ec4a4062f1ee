"""``twinrun ladder``: the case study's rungs, one technique added at a time, in both frameworks; the ablations
"top rung minus X"; the fastest configuration measured, with the command that reproduces it; optionally time to
accuracy over whole epochs."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from common.errors import ConfigError
from experiments.catalog import defaults
from experiments.catalog.presets import model_tag
from experiments.catalog.rungs import DEFAULT_ORDER, Device, default_loader_workers, parse_order
from experiments.execution.device import cuda_available
from experiments.execution.plan import (
    DEFAULT_ACCURACY_EPOCHS,
    Configuration,
    LadderOptions,
    PlannedRun,
    execute,
    ladder_plan,
    ladder_repeat,
    outcome_line,
    prepare,
    repeat_base,
    with_paired_weights,
)
from experiments.execution.preflight import check_runnable
from experiments.execution.record import RunRecord
from experiments.options import (
    adaptive_options,
    add_plan_arguments,
    console_for_output,
    nonnegative_int,
    plan_options,
    positive_int,
    unit_fraction,
)
from experiments.reporting.analysis import analyse, ladder_pairs
from experiments.reporting.cells import ladder_cells
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser, "ladder-<preset>[-<model>][-<order>][-accuracy]")
    ladder = parser.add_argument_group("ladder")
    ladder.add_argument("--workers", type=nonnegative_int, default=None,
                        help="the loader rung's worker count (default: CPU count, at most 8)")
    ladder.add_argument("--rungs", "--order", dest="rungs", default=None, metavar="T1,T2,...",
                        help=f"the techniques in the order the rungs add them, after the baseline (default: the "
                             f"article's, {','.join(DEFAULT_ORDER)}; a JAX user starts with compile)")
    ladder.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the top rung minus each technique")
    ladder.add_argument("--ablation-repeats", type=positive_int, default=None, metavar="N",
                        help="measure the ablations in the first N repeats only (default: every repeat); each is "
                             "judged with its framework's pooled run-to-run spread, and the adaptive step adds runs "
                             "of those still undecided")
    accuracy = parser.add_argument_group("time to accuracy")
    accuracy.add_argument("--to-accuracy", type=unit_fraction, default=None, metavar="A",
                          help="each run trains whole epochs until its evaluation accuracy (whole eval split, at every "
                               "epoch end) reaches A; each repeat has its own seed; default data: the generated "
                               "archive made harder (LADDER_DIFFICULTY in experiments/catalog/defaults.py), so that "
                               "accuracy climbs over several epochs")
    accuracy.add_argument("--epochs", type=positive_int, default=None,
                          help="whole epochs per run: the most with --to-accuracy (default 5), or exactly this many")
    # test hooks: make one run die, to show that the ladder records it failed and goes on; break a rung's LR, a
    # planted accuracy drop the verdict must call "lost"
    parser.add_argument("--inject-failure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--break-lr", default=None, help=argparse.SUPPRESS)


def _default_name(args: argparse.Namespace, order: tuple[str, ...]) -> str:
    name = f"ladder-{args.preset}{model_tag(args.preset, args.model)}"
    if order != DEFAULT_ORDER:
        name += "-" + "-".join(order)
    if args.to_accuracy is not None or args.epochs is not None:
        name += "-accuracy"
    return name


def check_accuracy_flags(args: argparse.Namespace) -> None:
    """``--steps`` with ``--to-accuracy`` or ``--epochs`` is refused by name: a time-to-accuracy ladder trains whole
    epochs, so the steps would be dropped silently (or cut the epochs short without reaching any target)."""
    accuracy = [flag for flag, value in (("--to-accuracy", args.to_accuracy), ("--epochs", args.epochs))
                if value is not None]
    if args.steps is not None and accuracy:
        raise ConfigError(f"--steps does not combine with {' and '.join(accuracy)}: that ladder trains whole epochs "
                          f"(at most --epochs, default {DEFAULT_ACCURACY_EPOCHS}); cap it with --epochs E, or leave "
                          f"{' and '.join(accuracy)} out to time --steps steps")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    order = parse_order(args.rungs)
    check_accuracy_flags(args)
    options = plan_options(args)
    accuracy = args.to_accuracy is not None or args.epochs is not None
    # the plain generated archive is learnt in 3 epochs: no curve to see
    if accuracy and options.data is None and options.source == "cifar100":
        archive = defaults.default_archive(options.source, difficulty=defaults.LADDER_DIFFICULTY)
        options = replace(options, data=str(archive))
    prepared = prepare(options, _default_name(args, order))
    workers = args.workers if args.workers is not None else default_loader_workers()
    ladder = LadderOptions(Device(cuda_available(), workers), order, args.ablations,
                           ablation_repeats=args.ablation_repeats, to_accuracy=args.to_accuracy, epochs=args.epochs,
                           inject_failure=args.inject_failure, break_lr=args.break_lr)
    check_runnable(repeat_base(prepared, 0, ladder), prepared.frameworks)  # before weights, lock or folder
    console = console_for_output()
    with prepared.store.locked("ladder", "another --name or --results"):
        prepared = with_paired_weights(prepared)
        plan = ladder_plan(prepared, args.repeats, args.preset, ladder, args.order_seed)

        def undecided(records: list[RunRecord]) -> set[Configuration]:
            cells = ladder_cells(records)
            return analyse(cells, ladder_pairs(cells, order)).needs_more(args.precision)

        def repeat(number: int, only: set[Configuration]) -> list[PlannedRun]:
            return ladder_repeat(prepared, number, f"{number + 1} (adaptive)", args.preset, ladder, only)

        outcome = execute(plan, prepared.store, prepared.out.name, args.timeout, console, fresh=args.fresh,
                          adaptive=adaptive_options(args, undecided, repeat, started))
        report = write_report(prepared.out)
    for table in (report.table, *report.tables):
        console.print(table)
    for line in report.summary:
        console.print(line)
    console.print(f"rows: {prepared.store.path} (exports: {prepared.store.jsonl.name}, {prepared.store.csv.name})\n"
                  f"report: {report.path}\n{outcome_line(outcome)}")
    return 0 if outcome.complete else 1
