"""``twinrun`` (= ``python -m experiments``): the driver's commands."""

from __future__ import annotations

import argparse
import sys

from common.errors import TwinrunError


def build_parser() -> argparse.ArgumentParser:
    from experiments import ladder, loader_bench, parity, report, run_cmd

    parser = argparse.ArgumentParser(prog="twinrun", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    loader_bench.add_arguments(commands.add_parser("loader-bench", help="loader images/s per framework and worker count"))
    ladder.add_arguments(commands.add_parser("ladder", help="the case study: rungs x frameworks, side by side"))
    report.add_arguments(commands.add_parser("report", help="markdown report + plots of a results folder"))
    run_cmd.add_arguments(commands.add_parser("run", help="one configuration through both frameworks, paired"))
    parity.add_arguments(commands.add_parser("parity", help="torch vs Flax on transferred weights: logits, statistics, gradients"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "loader-bench":
            from experiments import loader_bench

            loader_bench.run(args)
        elif args.command == "ladder":
            from experiments import ladder

            return ladder.run(args)
        elif args.command == "report":
            from experiments import report

            return report.run(args)
        elif args.command == "run":
            from experiments import run_cmd

            return run_cmd.run(args)
        elif args.command == "parity":
            from experiments import parity

            return parity.run(args)
    except TwinrunError as exc:
        print(f"twinrun {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
