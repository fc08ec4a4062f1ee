"""``twinrun diagnose``: is a run input-bound, compute-bound or overhead-bound, and the evidence (how each
is measured: experiments/execution/diagnosis.py)."""

from __future__ import annotations

import argparse

from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.diagnosis import diagnose, diagnosis_config, write_diagnoses
from experiments.execution.frameworks import selected
from experiments.execution.preflight import check_runnable
from experiments.execution.store import writable_folder
from experiments.options import add_framework_argument, add_timeout_argument, console_for_output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_framework_argument(parser)
    parser.add_argument("--out", default="results/diagnose", help="folder of diagnosis.json and the traces")
    add_timeout_argument(parser, 1800.0)
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = diagnosis_config(config_from_args(args))
    frameworks = selected(args.framework, config.model)
    check_runnable(config, frameworks)
    out = writable_folder(args.out, "--out")
    console = console_for_output()
    results = []
    for framework in frameworks:
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
