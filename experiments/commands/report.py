"""``twinrun report``: markdown tables and PNG plots from a results folder, with published figures beside ours."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", default="results/ladder-cpu", help="a results folder holding runs.jsonl")


def run(args: argparse.Namespace) -> int:
    report = write_report(Path(args.folder))
    Console(width=180).print(report.table)
    print(f"report: {report.path}")
    return 0
