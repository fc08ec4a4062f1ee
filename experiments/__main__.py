"""``twinrun`` (= ``python -m experiments``): the driver's commands."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from common.errors import TwinrunError
from experiments.commands import diagnose, infer, ladder, loader_bench, overhead, parity, report, run, sweep, train

# command -> (module in experiments/commands/, help); each module has add_arguments(parser) and run(args) -> exit code
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    "ladder": (ladder, "the case study: rungs x frameworks, side by side"),
    "sweep": (sweep, "one technique over several values, both frameworks"),
    "diagnose": (diagnose, "input-, compute- or overhead-bound? with the evidence"),
    "report": (report, "markdown report + plots of a results folder"),
    "train": (train, "one framework's trainer in this process (the entry point under torchrun)"),
    "run": (run, "one configuration through both frameworks, paired"),
    "parity": (parity, "torch vs Flax on transferred weights: logits, statistics, gradients"),
    "loader-bench": (loader_bench, "loader images/s per framework and worker count"),
    "infer": (infer, "inference variants: latency p50/p99, throughput and accuracy, both frameworks"),
    "overhead": (overhead, "our trainer's step vs a minimal hand-written loop"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twinrun", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module, text) in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=text))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = COMMANDS[args.command][0].run(args)
        return code if isinstance(code, int) else 0
    except TwinrunError as exc:
        print(f"twinrun {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
