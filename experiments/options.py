"""Command-line pieces several commands share: the ladder's and the sweeps' plan flags, the --framework
choice, argparse types that refuse nonsense by name (positive_int, ...), the check that an output folder can
be written, and the console they print to."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from rich.console import Console

from common.config import TORCH_COMPILE_BACKENDS
from common.workloads import known_models
from experiments.catalog.presets import PRESETS
from experiments.execution.frameworks import CHOICES, FRAMEWORKS
from experiments.execution.plan import Adaptive, Configuration, PlannedRun, PlanOptions
from experiments.execution.record import RunRecord

PLAN_SOURCES = ("cifar100", "cifar10", "mnist5k")  # the labelled sources a ladder or sweep reads


def console_for_output() -> Console:
    """A console as wide as the terminal, or 180 columns when the output is a file or a pipe."""
    return Console(width=None if Console().is_terminal else 180)


def plural(count: int, word: str) -> str:
    """'1 epoch', '3 epochs': a count with its noun as a reader writes it."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def folder_name(text: str) -> str:
    """argparse type: one folder name inside --results (not a path that could write elsewhere, not empty)."""
    if not text.strip() or text in (".", "..") or "/" in text or "\\" in text:
        raise argparse.ArgumentTypeError(f"must be one folder name inside --results (not empty, no '/', not '.' or "
                                         f"'..'), got {text!r}")
    return text


def _parsed(text: str, kind: Callable[[str], Any], wanted: str) -> Any:
    """``kind(text)``, or argparse's error saying what was wanted."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got '{text}'") from None


def positive_int(text: str) -> int:
    """argparse type: an integer of 1 or more."""
    value = _parsed(text, int, "a positive integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer of 0 or more."""
    value = _parsed(text, int, "an integer of 0 or more")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0 (nan and inf refused)."""
    value = _parsed(text, float, "a positive number")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number of 0 or more."""
    value = _parsed(text, float, "a number of 0 or more")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text}")
    return value


def unit_fraction(text: str) -> float:
    """argparse type: a number in (0, 1], such as an accuracy."""
    value = _parsed(text, float, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (an accuracy of 0.6 is 60%), got {text}")
    return value


def percent(text: str) -> float:
    """argparse type: a percentage in (0, 100), "5" or "5%", as a fraction (0.05)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 5 or 5%, got '{text}'") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"must be a percentage between 0 and 100 (5 means +-5%), got {text}")
    return value / 100


def duration(text: str) -> float:
    """argparse type: seconds, "480", "480s" or "8m" (above 0)."""
    scale = 60.0 if text.strip().endswith("m") else 1.0
    try:
        value = float(text.strip().removesuffix("m").removesuffix("s")) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 480, 480s or 8m, got '{text}'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers of 0 or more (worker counts)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"worker counts must be 0 or more, got '{text}'")
    return values


def add_framework_argument(parser: Any, both: bool = True) -> None:
    if both:
        parser.add_argument("--framework", choices=CHOICES, default="both", help="the framework(s) to run")
    else:
        parser.add_argument("--framework", choices=FRAMEWORKS, required=True,
                            help="the framework whose trainer runs in this process")


def add_timeout_argument(parser: Any, seconds: float,
                         what: str = "one run") -> None:
    parser.add_argument("--timeout", type=positive_float, default=seconds, metavar="SECONDS",
                        help=f"seconds allowed to {what} before it is stopped and recorded as timed out")


def add_plan_arguments(parser: argparse.ArgumentParser, default_name: str) -> None:
    """The arguments the ladder and the sweeps share, in a "plan" and an "output" group."""
    plan = parser.add_argument_group("plan")
    plan.add_argument("--preset", choices=tuple(PRESETS), default="cpu",
                      help="base configuration (cpu: small enough for 2 CPU cores; tiny: a smoke test; article: "
                           "ResNet-50 at width 1)")
    plan.add_argument("--model", choices=known_models(), default=None,
                      help="the model (default: the preset's); a model of another family trains with its family's "
                           "recipe (a ViT: AdamW, lr 1e-3, weight decay 0.05; experiments/catalog/presets.py) and its "
                           "results go to a folder named after it")
    add_framework_argument(plan)
    plan.add_argument("--source", choices=PLAN_SOURCES, default="cifar100", help="data set")
    plan.add_argument("--data", default=None,
                      help="CIFAR archive/folder (or mnist_5k.csv.gz); default: a generated archive of the source's "
                           "format")
    plan.add_argument("--steps", type=positive_int, default=None,
                      help="optimizer steps of each run (default: the preset's)")
    plan.add_argument("--repeats", type=positive_int, default=3,
                      help="runs of each configuration, each a process of its own (runs are what the intervals count)")
    plan.add_argument("--devices", type=positive_int, default=None,
                      help="data-parallel replicas, batch size per replica (torch: DDP processes; JAX: devices); "
                           "default: one per process")
    plan.add_argument("--read-latency-ms", type=nonnegative_float, default=0.0, metavar="MS",
                      help="simulated storage latency per training batch read, in every run (a slow network "
                           "filesystem: what loader workers hide)")
    plan.add_argument("--processes", type=positive_int, default=1,
                      help="JAX processes the devices are spread over (jax.distributed)")
    plan.add_argument("--torchcompile-backend", choices=TORCH_COMPILE_BACKENDS, default="inductor",
                      help="torch.compile's backend in every compiled torch run: inductor (generated kernels), "
                           "aot_eager (dynamo's graphs, guards and recompiles, run with eager kernels: a smoke test "
                           "of the plan without inductor's compile time) or eager; torch only")
    add_timeout_argument(plan, 1800.0)
    answers = parser.add_argument_group("intervals and verdicts")
    answers.add_argument("--no-control", dest="control", action="store_false",
                         help="leave out the A/A control (the reference configuration run once more in every repeat, "
                              "per framework): the verdicts then have no measured noise floor; for a smoke test of "
                              "the plan, not for findings")
    answers.add_argument("--precision", type=percent, default=None, metavar="P",
                         help="after the requested repeats, add interleaved repeats of the configurations whose "
                              "comparisons are still undecided until each is decided, or known within +-P percent "
                              "(e.g. 5 or 5%%), or the time budget runs out")
    answers.add_argument("--time-budget", type=duration, default=None, metavar="SECONDS",
                         help="the most the whole command may take with its adaptive repeats (480, 480s or 8m); alone, "
                              "it adds repeats of undecided comparisons until it runs out")
    answers.add_argument("--max-repeats", type=positive_int, default=12,
                         help="the most repeats of any configuration, the adaptive ones included")
    answers.add_argument("--order-seed", type=nonnegative_int, default=0,
                         help="seed of each repeat's random order of the configurations (recorded in every row)")
    output = parser.add_argument_group("output")
    output.add_argument("--name", type=folder_name, default=None,
                        help=f"results folder name, one folder inside --results (default: {default_name})")
    output.add_argument("--results", default="results", help="folder holding the results folders")
    output.add_argument("--fresh", action="store_true",
                        help="start over: move the folder's earlier results to NAME/old/<time>/ (once every check "
                             "passed; nothing is deleted)")


def plan_options(args: argparse.Namespace) -> PlanOptions:
    return PlanOptions(preset=args.preset, model=args.model, framework=args.framework, source=args.source,
                       data=args.data, steps=args.steps,
                       repeats=args.repeats, name=args.name, results=args.results, fresh=args.fresh,
                       devices=args.devices, processes=args.processes,
                       read_latency_ms=args.read_latency_ms, torchcompile_backend=args.torchcompile_backend,
                       control=args.control)


def adaptive_options(args: argparse.Namespace, undecided: Callable[[list[RunRecord]], set[Configuration]],
                     repeat: Callable[[int, set[Configuration]], list[PlannedRun]], started: float) -> Adaptive | None:
    """The adaptive step of a ladder or sweep, when ``--precision`` or ``--time-budget`` asks for one."""
    if args.precision is None and args.time_budget is None:
        return None
    return Adaptive(undecided, repeat, precision=args.precision, budget_s=args.time_budget, started=started,
                    first_repeat=args.repeats, max_repeats=max(args.max_repeats, args.repeats),
                    order_seed=args.order_seed)
