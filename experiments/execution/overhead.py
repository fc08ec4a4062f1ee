"""Our trainer's steady-state step against a minimal hand-written loop on the same model and batches, per
framework, in one process. The ratio is what twinrun's machinery (step grouping, loss-scale bookkeeping,
schedule, timing) costs on top of the bare framework; the goal is <= 1.05.

Both sides time the same interval: from a batch already on the device to the loss read back on the host
(the trainer's "compute" time; its data wait is left out, since the minimal loop reads pre-loaded
batches). The minimal loop runs before and after the trainer, and both sets of its samples count, so a
slow drift of the machine does not favour either side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from common.config import RunConfig
from common.data.batches import preview_batches
from common.errors import ConfigError
from common.timing import summarize
from common.workloads import arch as describe
from common.workloads import open_sources
from experiments.catalog.defaults import with_default_data
from experiments.execution.frameworks import fit_function
from experiments.execution.runner import run_isolated

GOAL = 1.05
HostBatch = tuple[np.ndarray, np.ndarray]
# (config, architecture, batches, warm-up steps, timed steps) -> (timed seconds, first loss)
MinimalLoop = Callable[[RunConfig, Any, list[HostBatch], int, int], tuple[list[float], float]]


def overhead_config(config: RunConfig, given_steps: bool) -> RunConfig:
    """``config`` on its data (the generated archive if none), 30 steps after 5 warm-up ones unless given."""
    config = with_default_data(config)
    if not given_steps:
        config = config.replace(steps=30, epochs=None, timing_warmup=5)
    return config


def _torch_minimal(config: RunConfig, arch: Any, batches: list[HostBatch], warmup: int,
                   steps: int) -> tuple[list[float], float]:
    import torch
    import torch.nn.functional as F

    from torch_impl.amp import autocast
    from torch_impl.compilation import compile_options
    from torch_impl.data import current_device, synchronize, to_nchw
    from torch_impl.techniques import apply_flags
    from torch_impl.train import make_model

    device = current_device()
    apply_flags(config)
    model = make_model(config, arch)
    forward = torch.compile(model, **compile_options(config)) if config.compile == "compiled" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    on_device = [(to_nchw(x).to(device), torch.from_numpy(y).long().to(device)) for x, y in batches]
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


def _jax_minimal(config: RunConfig, arch: Any, batches: list[HostBatch], warmup: int,
                 steps: int) -> tuple[list[float], float]:
    import jax
    import jax.numpy as jnp
    import optax

    from jax_impl.techniques import apply_flags
    from jax_impl.train import make_model

    apply_flags(config)
    model, variables = make_model(config, arch)
    tx = optax.chain(optax.add_decayed_weights(config.weight_decay), optax.sgd(config.lr, momentum=config.momentum))

    def step(params, batch_stats, opt_state, images, labels):
        # a model without BatchNorm (a ViT) has no batch_stats: an empty collection, passed and returned as such
        def loss_of(p):
            variables = {"params": p, **({"batch_stats": batch_stats} if batch_stats else {})}
            logits, updates = model.apply(variables, images, train=True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean(), updates
        (loss, updates), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        changes, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), updates.get("batch_stats", {}), opt_state, loss

    # eager: the step without jax.jit, as the trainer's eager step (jax_impl/train.py), not jax.disable_jit
    run = jax.jit(step, donate_argnums=(0, 1, 2)) if config.compile == "compiled" else step
    params, batch_stats = variables["params"], variables.get("batch_stats", {})
    opt_state = tx.init(params)
    on_device = [(jax.device_put(x), jax.device_put(y)) for x, y in batches]
    times, losses = [], []
    for i in range(warmup + steps):
        images, labels = on_device[i % len(on_device)]
        start = time.perf_counter()
        params, batch_stats, opt_state, loss = run(params, batch_stats, opt_state, images, labels)
        losses.append(float(jax.block_until_ready(loss)))
        times.append(time.perf_counter() - start)
    return times[warmup:], losses[0]


# The bare loop of each framework, written out here (what a user would write without twinrun).
MINIMAL_LOOPS: dict[str, MinimalLoop] = {"torch": _torch_minimal, "jax": _jax_minimal}


def check_supported(config: RunConfig) -> None:
    if config.precision not in ("fp32", "bf16") or config.grad_accum_steps != 1 or config.optimizer != "sgd":
        raise ConfigError("the overhead benchmark's minimal loop covers fp32/bf16, k = 1 and SGD (what a bare loop "
                          "would be); give the trainer's extra features their own runs")


def measure_in_process(framework: str, config: RunConfig) -> dict[str, Any]:
    """Minimal loop, our trainer's fit, minimal loop again; all in this process, on the same batches."""
    check_supported(config)
    config = config.replace(schedule="constant", warmup_steps=0, eval_batches=1)  # the minimal loop's LR is constant
    train_source = open_sources(config)[0]
    arch = describe(config, train_source.num_classes)  # the trainer's classifier: as many outputs as the data has
    batches = preview_batches(train_source, config.batch_size, config.seed, train=True, count=8)
    minimal = MINIMAL_LOOPS[framework]
    timed = max(config.steps - config.timing_warmup, 1)  # type: ignore[operator]
    before, first_loss = minimal(config, arch, batches, config.timing_warmup, timed)
    result = fit_function(framework)(config)
    after, _ = minimal(config, arch, batches, config.timing_warmup, timed)
    if result.timing.compute_s is None or result.timing.step_s is None:
        raise RuntimeError(f"the trainer's run ({result.status}) has no timed steps: {result.error or ''}")
    trainer = result.timing.compute_s
    bare = summarize(before + after)
    return {"status": "ok", "framework": framework, "device": result.device, "trainer_compute_s": asdict(trainer),
            "trainer_step_s": asdict(result.timing.step_s), "minimal_s": bare, "ratio": trainer.median / bare["median"],
            "minimal_before_median_s": statistics.median(before), "minimal_after_median_s": statistics.median(after),
            "timed_steps": timed, "num_classes": arch.num_classes,
            # the steps themselves, for the ratio's interval (experiments/commands/overhead.py)
            "trainer_samples_s": list(result.timing.compute_samples_s), "minimal_samples_s": before + after,
            # the same model, initial weights and first batch: the two first losses must agree
            "first_loss": {"trainer": result.losses[0], "minimal": first_loss}}


def measure_isolated(framework: str, config: RunConfig, timeout_s: float | None) -> dict[str, Any]:
    """``measure_in_process`` in a process of its own: the row of one framework (failed, with the reason, if the
    process died or timed out)."""
    result = run_isolated("overhead", {"framework": framework, "config": config.to_dict()}, timeout_s=timeout_s)
    return {"framework": framework, **result}
