"""``twinrun diagnose``: is a run input-bound, compute-bound or overhead-bound, and the evidence (how each
is measured: experiments/execution/diagnosis.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_config_arguments, config_from_args
from experiments.execution.diagnosis import diagnose, diagnosis_config, write_diagnoses
from experiments.execution.frameworks import selected
from experiments.options import add_framework_argument, console_for_output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--out", default="results/diagnose")
    parser.add_argument("--timeout", type=float, default=1800.0)
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = diagnosis_config(config_from_args(args))
    out = Path(args.out)
    console = console_for_output()
    results = []
    for framework in selected(args.framework):
        console.print(f"[bold]diagnose[/] {framework}: runs at batch {config.batch_size} (traced) and "
                      f"{2 * config.batch_size} ...")
        found = diagnose(framework, config, out, args.profile_steps or 3, args.timeout)
        results.append(found)
        console.print(f"[bold]{framework}: {found.verdict}[/]")
        for line in found.evidence:
            console.print(f"  - {line}")
    path = write_diagnoses(out / "diagnosis.json", config, results)
    console.print(f"written: {path}")
    return 0
