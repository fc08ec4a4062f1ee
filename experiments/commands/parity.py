"""``twinrun parity``: torch vs Flax on transferred weights, one batch: logits, BN statistics, gradients
(the checks themselves: experiments/execution/parity.py)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from common.arch import FAMILY, NORMS, STEMS, resnet
from common.config import RunConfig
from common.workloads import ModelNames, is_spec, load_workload
from experiments.execution.parity import TOLERANCES, paired_forward_backward
from experiments.options import nonnegative_int, positive_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="resnet18", choices=ModelNames(FAMILY),
                       help="architecture: a ResNet, or a workload from outside the repository (module:NAME, "
                            "path/to/file.py:NAME)")
    model.add_argument("--stem", default="cifar", choices=STEMS, help="cifar: 3x3 conv; imagenet: 7x7 conv + max-pool")
    model.add_argument("--width", type=positive_float, default=0.25, help="channel multiplier of the ResNet")
    model.add_argument("--num-classes", type=positive_int, default=100, help="classifier outputs")
    model.add_argument("--norm", default="batch", choices=NORMS, help="normalisation layer")
    model.add_argument("--zero-init-residual", action="store_true", help="zero each block's last norm scale")
    batch = parser.add_argument_group("batch")
    batch.add_argument("-b", "--batch-size", type=positive_int, default=8, help="images in the one batch compared")
    batch.add_argument("--image-size", type=positive_int, default=32, help="image side in pixels")
    batch.add_argument("--seed", type=nonnegative_int, default=0, help="weights and batch seed")
    batch.add_argument("--float64", action="store_true", help="compare in float64 (semantics, free of rounding)")


def run(args: argparse.Namespace) -> int:
    console = Console()
    if is_spec(args.model):
        workload = load_workload(args.model)
        if reason := workload.missing("torch") or workload.missing("jax"):
            console.print(f"parity: skipped ({reason})")
            return 0
        arch = workload.describe(RunConfig(model=args.model, image_size=args.image_size), args.num_classes)
        model = args.model
    else:
        arch = resnet(args.model, stem=args.stem, width=args.width, num_classes=args.num_classes, norm=args.norm,
                      zero_init_residual=args.zero_init_residual)
        model = f"{args.model} stem={args.stem} width={args.width}"
    results = paired_forward_backward(arch, args.batch_size, args.image_size, args.seed, args.float64)
    precision = "fp64" if args.float64 else "fp32"
    table = Table(title=f"parity torch vs Flax, {precision}, {model} batch={args.batch_size} "
                        f"(max |flax - torch| / max |torch|)")
    for column in ("quantity", "max relative difference", "tolerance", "verdict"):
        table.add_column(column)
    failed = False
    for name, value in results.items():
        ok = value <= TOLERANCES[name]
        failed |= not ok
        table.add_row(name, f"{value:.2e}", f"{TOLERANCES[name]:.0e}", "ok" if ok else "[red]ABOVE TOLERANCE[/]")
    console.print(table)
    if failed and not args.float64:
        console.print("In fp32 a ReLU input within rounding of zero can switch sides in one framework only, and deep "
                      "random-init BatchNorm stacks amplify rounding; rerun with --float64 to separate that from a "
                      "real difference (fp64 agreement is ~1e-14).")
    return 1 if failed else 0
