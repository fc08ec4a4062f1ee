"""``twinrun compare A B``: two results folders, configuration by configuration (before and after a library upgrade,
two machines, two commits): B's step time (or latency) against A's with its 95% interval and a verdict; settings
that differ beyond the host are named, not matched (how: experiments/reporting/compare.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from experiments.execution.store import atomic_write_text
from experiments.reporting.compare import compare_folders, load, markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the results folder compared against (before, the baseline)")
    parser.add_argument("b", help="the results folder compared (after)")
    parser.add_argument("--ignore", nargs="+", default=[], metavar="SETTING",
                        help="settings whose difference is part of the comparison, so that configurations differing in "
                             "them are matched anyway, e.g. config.workers (as the unmatched lines name them)")
    parser.add_argument("--out", default=None, help="also write the comparison here (markdown)")


def run(args: argparse.Namespace) -> int:
    a, b = load(Path(args.a)), load(Path(args.b))
    found = compare_folders(a, b, args.ignore)
    text = markdown(a, b, found)
    Console(width=180).print(text, markup=False, highlight=False)
    if args.out:
        atomic_write_text(Path(args.out), text)
        print(f"comparison: {args.out}")
    return 0
