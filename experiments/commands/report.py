"""``twinrun report``: markdown tables and PNG plots from a results folder, with published figures beside ours.

The folder's store is read read-only; the report and its plots are written into the folder, or into --out when the
folder is not writable here."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from experiments.execution.store import ResultsError, writable_folder
from experiments.reporting.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", default="results/ladder-cpu",
                        help="a results folder (its store is runs.sqlite)")
    parser.add_argument("--out", default=None,
                        help="folder to write report.md and its plots into (default: the results folder itself)")


def run(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if args.out is not None:
        out = writable_folder(args.out, "--out")
    else:
        out = folder
        try:
            writable_folder(folder, "results folder", create=False)
        except ResultsError as exc:
            if not folder.is_dir():
                raise
            raise ResultsError(f"{exc}: report.md and its plots cannot be written there; give --out DIR to write "
                               f"them elsewhere (the rows are read without writing)") from None
    report = write_report(folder, None if out == folder else out)
    Console(width=180).print(report.table)
    print(f"report: {report.path}")
    return 0
