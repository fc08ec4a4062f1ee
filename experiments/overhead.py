"""``twinrun overhead``: our trainer's steady-state step against a minimal hand-written loop on the same
model and batches, per framework, in one process run. The ratio is what twinrun's machinery (step
grouping, loss-scale bookkeeping, schedule, timing) costs on top of the bare framework; the goal is <= 1.05.

Both sides time the same interval: from a batch already on the device to the loss read back on the host
(the trainer's "compute" time; its data wait is left out, since the minimal loop reads pre-loaded
batches). The minimal loop runs before and after the trainer, and both sets of its samples count, so a
slow drift of the machine does not favour either side.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from common.config import (
    RunConfig,
    add_config_arguments,
    config_from_args,
    open_sources,
)
from common.errors import ConfigError
from common.results import atomic_write_text
from common.timing import summarize

GOAL = 1.05


def _first_batches(config: RunConfig, count: int) -> list[tuple[Any, Any]]:
    """The first ``count`` training batches of epoch 0 as numpy arrays (the trainer's own first batches)."""
    from common.data.batches import preview_batches

    return preview_batches(open_sources(config)[0], config.batch_size, config.seed, train=True, count=count)


def _torch_minimal(config: RunConfig, batches: list, warmup: int, steps: int) -> tuple[list[float], float]:
    import torch
    import torch.nn.functional as F

    from torch_impl.data import default_device, synchronize, to_nchw
    from torch_impl.techniques import apply_flags, autocast
    from torch_impl.train import make_model

    device = default_device()
    apply_flags(config, device)
    model = make_model(config, config.arch(100), device)
    forward = torch.compile(model, mode=config.torchcompile_mode) if config.compile == "compiled" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    on_device = [(to_nchw(x).to(device), torch.from_numpy(y).long().to(device))
                 for x, y in batches]
    times, losses = [], []
    for i in range(warmup + steps):
        images, labels = on_device[i % len(on_device)]
        synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast(config, device):
            logits = forward(images)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times[warmup:], losses[0]


def _jax_minimal(config: RunConfig, batches: list, warmup: int, steps: int) -> tuple[list[float], float]:
    import contextlib

    import jax
    import jax.numpy as jnp
    import optax

    from jax_impl.techniques import apply_flags
    from jax_impl.train import make_model

    apply_flags(config)
    model, variables = make_model(config, config.arch(100))
    tx = optax.chain(optax.add_decayed_weights(config.weight_decay), optax.sgd(config.lr, momentum=config.momentum))

    def step(params, batch_stats, opt_state, images, labels):
        def loss_of(p):
            logits, updates = model.apply({"params": p, "batch_stats": batch_stats}, images, train=True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean(), updates
        (loss, updates), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        changes, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), updates["batch_stats"], opt_state, loss

    compiled = config.compile == "compiled"
    run = jax.jit(step, donate_argnums=(0, 1, 2)) if compiled else step
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)
    on_device = [(jax.device_put(x), jax.device_put(y)) for x, y in batches]
    times, losses = [], []
    with contextlib.nullcontext() if compiled else jax.disable_jit():
        for i in range(warmup + steps):
            images, labels = on_device[i % len(on_device)]
            start = time.perf_counter()
            params, batch_stats, opt_state, loss = run(params, batch_stats, opt_state, images, labels)
            losses.append(float(jax.block_until_ready(loss)))
            times.append(time.perf_counter() - start)
    return times[warmup:], losses[0]


def measure_in_process(framework: str, config: RunConfig) -> dict[str, Any]:
    """Minimal loop, our trainer's fit, minimal loop again; all in this process, on the same batches."""
    if config.precision not in ("fp32", "bf16") or config.grad_accum_steps != 1 or config.optimizer != "sgd":
        raise ConfigError("the overhead benchmark's minimal loop covers fp32/bf16, k = 1 and SGD (what a bare loop "
                          "would be); give the trainer's extra features their own runs")
    config = config.replace(schedule="constant", warmup_steps=0, eval_batches=1)  # the minimal loop's LR is constant
    batches = _first_batches(config, 8)
    minimal = _torch_minimal if framework == "torch" else _jax_minimal
    timed = max(config.steps - config.timing_warmup, 1)  # type: ignore[operator]
    before, first_loss = minimal(config, batches, config.timing_warmup, timed)
    if framework == "torch":
        from torch_impl.train import fit
    else:
        from jax_impl.train import fit
    result = fit(config)
    after, _ = minimal(config, batches, config.timing_warmup, timed)
    trainer = result["timing"]["compute_s"]
    bare = summarize(before + after)
    return {"status": "ok", "framework": framework, "device": result.get("device"), "trainer_compute_s": trainer,
            "trainer_step_s": result["timing"]["step_s"], "minimal_s": bare,
            "ratio": trainer["median"] / bare["median"], "minimal_before_median_s": statistics.median(before),
            "minimal_after_median_s": statistics.median(after), "timed_steps": timed,
            # the same model, initial weights and first batch: the two first losses must agree
            "first_loss": {"trainer": result["losses"][0], "minimal": first_loss}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--out", default="results/overhead")
    parser.add_argument("--timeout", type=float, default=1800.0)
    add_config_arguments(parser)


def overhead_config(config: RunConfig, given_steps: bool) -> RunConfig:
    from experiments.defaults import with_default_data

    config = with_default_data(config)
    if not given_steps:
        config = config.replace(steps=30, epochs=None, timing_warmup=5)
    return config


def run(args: argparse.Namespace) -> int:
    import json

    from rich.table import Table

    from experiments.paired import FRAMEWORKS, paired_config
    from experiments.plan import console_for_output
    from experiments.runner import run_isolated

    config = overhead_config(config_from_args(args), args.steps is not None)
    config = paired_config(config, Path(args.out) / "weights")  # one starting point for both frameworks
    console = console_for_output()
    table = Table(title=f"trainer vs minimal loop: {config.model} width={config.width} batch={config.batch_size} "
                        f"precision={config.precision} compile={config.compile}; median of synchronized steps "
                        f"(device batch -> loss on host), goal <= {GOAL}")
    for column in ("framework", "trainer ms (p10..p90)", "minimal loop ms (p10..p90)", "ratio", "verdict"):
        table.add_column(column)
    results = []
    for framework in FRAMEWORKS if args.framework == "both" else (args.framework,):
        result = run_isolated("overhead", {"framework": framework, "config": config.to_dict()}, timeout_s=args.timeout)
        results.append(result)
        if result.get("status") != "ok":
            table.add_row(framework, "failed", "", "", str(result.get("error", ""))[:200])
            continue
        t, m = result["trainer_compute_s"], result["minimal_s"]
        table.add_row(framework, f"{t['median'] * 1e3:.2f} ({t['p10'] * 1e3:.2f}..{t['p90'] * 1e3:.2f})",
                      f"{m['median'] * 1e3:.2f} ({m['p10'] * 1e3:.2f}..{m['p90'] * 1e3:.2f})", f"{result['ratio']:.3f}",
                      "within goal" if result["ratio"] <= GOAL else "above goal")
    console.print(table)
    out = Path(args.out)
    atomic_write_text(out / "overhead.json", json.dumps({"config": config.to_dict(), "results": results}, indent=1, default=str))
    return 0 if all(r.get("status") == "ok" for r in results) else 1
