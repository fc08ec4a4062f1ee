"""Command-line pieces several commands share: the ladder's and the sweeps' plan flags, the --framework
choice, and the console they print to."""

from __future__ import annotations

import argparse

from rich.console import Console

from experiments.catalog.presets import PRESETS
from experiments.execution.frameworks import CHOICES, FRAMEWORKS
from experiments.execution.plan import PlanOptions


def console_for_output() -> Console:
    """A console as wide as the terminal, or 180 columns when the output is a file or a pipe."""
    return Console(width=None if Console().is_terminal else 180)


def add_framework_argument(parser: argparse.ArgumentParser, both: bool = True) -> None:
    if both:
        parser.add_argument("--framework", choices=CHOICES, default="both")
    else:
        parser.add_argument("--framework", choices=FRAMEWORKS, required=True)


def add_plan_arguments(parser: argparse.ArgumentParser, default_name: str) -> None:
    """The arguments the ladder and the sweeps share."""
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    add_framework_argument(parser)
    parser.add_argument("--data", default=None,
                        help="CIFAR archive/folder; default: a generated CIFAR-100-format archive")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default=None, help=f"results folder name (default: {default_name})")
    parser.add_argument("--results", default="results")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows and start over")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one run")
    parser.add_argument("--devices", type=int, default=None,
                        help="data-parallel replicas, batch size per replica (torch: DDP processes; JAX: devices); "
                             "default: one per process")
    parser.add_argument("--processes", type=int, default=1,
                        help="JAX processes the devices are spread over (jax.distributed)")


def plan_options(args: argparse.Namespace) -> PlanOptions:
    return PlanOptions(preset=args.preset, framework=args.framework, data=args.data, steps=args.steps,
                       repeats=args.repeats, name=args.name, results=args.results, fresh=args.fresh,
                       devices=args.devices, processes=args.processes)
