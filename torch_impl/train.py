"""The torch trainer. jax_impl/train.py exposes the same functions with the same roles:
make_model, make_optimizer, make_train_step, evaluate, fit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from common.arch import ResNetArch
from common.config import RunConfig, learning_rate, loader_options, open_sources
from common.data.batches import grouped
from common.metrics import is_diverged
from common.timing import StepTimer
from common.weights import load_torch_keyed
from torch_impl import checkpoint as ckpt
from torch_impl import parallel, pipeline
from torch_impl.data import make_loader, synchronize
from torch_impl.models import ResNet
from torch_impl.models import make_model as build_resnet
from torch_impl.profiling import StepProfiler
from torch_impl.techniques import (
    apply_flags,
    autocast,
    compile_counter,
    count_saved_bytes,
    make_grad_scaler,
    param_dtype,
)

StepFn = Callable[[list[tuple[torch.Tensor, torch.Tensor]], bool], torch.Tensor]


def make_model(config: RunConfig, arch: ResNetArch, device: torch.device) -> ResNet:
    torch.manual_seed(config.seed)
    model = build_resnet(arch, channels_last=config.channels_last)
    if config.init_weights:
        state = model.state_dict()
        for key, value in load_torch_keyed(config.init_weights).items():
            state[key] = torch.from_numpy(value).to(state[key].dtype)
        model.load_state_dict(state)
    model.checkpoint_stages = frozenset(config.checkpoint_stages)
    return model.to(device=device, dtype=param_dtype(config))


def make_optimizer(config: RunConfig, model: torch.nn.Module, total_steps: int):
    """SGD (momentum, coupled weight decay) or AdamW, and the shared LR formula as a LambdaLR."""
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=config.effective_lr, momentum=config.momentum,
                                    weight_decay=config.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.effective_lr, weight_decay=config.weight_decay,
                                      betas=(0.9, 0.999), eps=1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: float(learning_rate(step, config, total_steps, np)) / config.effective_lr)
    return optimizer, scheduler


def loss_fn(config: RunConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype.
    return F.cross_entropy(logits.to(param_dtype(config)), labels, label_smoothing=config.label_smoothing)


def make_train_step(config: RunConfig, model: torch.nn.Module, optimizer, scheduler, scaler, device) -> StepFn:
    """One optimizer step over k micro-batches: loss / k accumulated by backward, then one update.
    ``model`` may be DDP-wrapped: its gradients are then all-reduced on the last micro-batch only.

    Returns the mean micro-batch loss (a device tensor; the caller synchronizes)."""
    forward = torch.compile(model, mode=config.torchcompile_mode) if config.compile == "compiled" else model
    k = config.grad_accum_steps

    def step(micro_batches: list[tuple[torch.Tensor, torch.Tensor]], inject_inf: bool = False) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device, dtype=param_dtype(config))
        for index, (images, labels) in enumerate(micro_batches):
            with parallel.no_sync(model, last_micro_batch=index == len(micro_batches) - 1):
                with autocast(config, device):
                    logits = forward(images)
                loss = loss_fn(config, logits, labels)
                scaler.scale(loss / k).backward()
            total += loss.detach()
        if inject_inf:  # test hook: an overflowing gradient, as fp16 produces
            next(model.parameters()).grad.fill_(float("inf"))
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        # A step the scaler skipped is no optimizer step: the schedule stays where it is (as in JAX).
        if not (scaler.is_enabled() and scaler.get_scale() < scale_before):
            scheduler.step()
        return total / len(micro_batches)

    return step


def evaluate(config: RunConfig, model: torch.nn.Module, loader, device: torch.device) -> dict[str, float]:
    model.eval()
    correct, seen, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for number, (images, labels) in enumerate(loader.epoch(0)):
            if config.eval_batches is not None and number >= config.eval_batches:
                break
            images, labels = _to_device(config, images, labels, device)
            with autocast(config, device):
                logits = model(images)
            loss_sum += float(F.cross_entropy(logits.to(param_dtype(config)), labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
    model.train()
    return {"accuracy": correct / seen, "loss": loss_sum / seen, "samples": seen}


def _to_device(config: RunConfig, images: torch.Tensor, labels: torch.Tensor, device: torch.device):
    non_blocking = config.pin_mem and device.type == "cuda"
    images = images.to(device, non_blocking=non_blocking).to(param_dtype(config))
    if config.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=non_blocking)


def _micro_batches(loader, config: RunConfig, epoch: int, start_step: int) -> Iterator[list]:
    """The epoch's steps from ``start_step`` on, each a list of k micro-batches."""
    return grouped(loader.epoch(epoch, start_batch=start_step * config.grad_accum_steps), config.grad_accum_steps)


def measure_saved_bytes(config: RunConfig, model: torch.nn.Module, images: torch.Tensor, device) -> int:
    """Bytes saved for backward by one forward pass of the (uncompiled) model on one micro-batch."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with count_saved_bytes() as saved, autocast(config, device):
        model(images).float().sum().backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # the extra pass must not move BatchNorm statistics
    return saved[0]


def fit(config: RunConfig) -> dict[str, Any]:
    """Trains per ``config``; returns losses, timing, memory, evaluation and notes (one result row)."""
    replica = parallel.start(config)  # one process, or one DDP replica under torchrun
    device = parallel.device_for(replica)
    notes = apply_flags(config, device)
    if config.processes > 1:
        notes.append(f"processes={config.processes}: no effect on torch, which runs one DDP process per device")
    train_source, test_source = open_sources(config)
    arch = config.arch(train_source.num_classes)
    # Data-parallel replicas read their slices of the global batch; pipeline stages all read the whole batch
    # (the first stage uses the images, the last the labels).
    data_rank, data_world = (0, 1) if config.pipeline_stages > 1 else (replica.rank, replica.world_size)
    train_loader = make_loader(train_source, loader_options(config, train=True, rank=data_rank, world_size=data_world))
    eval_loader = make_loader(test_source, loader_options(config, train=False))
    steps_per_epoch = len(train_loader) // config.grad_accum_steps
    if steps_per_epoch == 0:
        raise ValueError(f"an epoch of {len(train_loader)} batches holds no step of {config.grad_accum_steps} micro-batches")
    total_steps = config.steps or config.epochs * steps_per_epoch  # type: ignore[operator]

    model = make_model(config, arch, device)
    optimizer, scheduler = make_optimizer(config, model, total_steps)
    scaler = make_grad_scaler(config, device)
    if config.pipeline_stages > 1:
        step_fn = pipeline.make_train_step(config, model, optimizer, scheduler, replica, device,
                                           lambda logits, labels: loss_fn(config, logits, labels))
        notes += pipeline.notes(config)
    else:
        step_fn = make_train_step(config, parallel.wrap(model, config, replica, device), optimizer, scheduler, scaler, device)

    def whole_model_on_rank_0() -> None:
        if config.pipeline_stages > 1:
            pipeline.gather_to_first(model, replica)

    start = 0
    if config.resume and config.checkpoint_dir and (path := ckpt.latest(config.checkpoint_dir)):
        state = ckpt.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
        notes.append(f"resumed from step {start}")

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    compiles_before = compile_counter()
    timer = StepTimer(config.timing_warmup)
    losses: list[float] = []
    loss_scales: list[float] = []
    evals: list[dict[str, Any]] = []
    status, step = "ok", start
    first_images = None
    clock = time.perf_counter
    profiler: StepProfiler | None = None
    while step < total_steps and status == "ok":
        epoch, offset = divmod(step, steps_per_epoch)
        batches = _micro_batches(train_loader, config, epoch, offset)
        while step < total_steps:
            if config.profile_steps and profiler is None and step >= total_steps - config.profile_steps:
                profiler = StepProfiler(config.profile_dir, device)  # type: ignore[arg-type]
                profiler.start()
            t0 = clock()
            group = next(batches, None)
            if group is None:
                break
            group = [_to_device(config, x, y, device) for x, y in group]
            synchronize(device)
            t1 = clock()
            loss = step_fn(group, inject_inf=config.inject_inf_at_step == step)
            value = float(parallel.mean_across_replicas(loss, replica))  # a host read: waits for the device
            synchronize(device)
            t2 = clock()
            if profiler is None:
                timer.record(t1 - t0, t2 - t1, sum(len(y) for _, y in group) * data_world)  # global images
            else:  # traced steps are slower: kept out of the steady-state statistics
                profiler.step()
            if first_images is None:
                first_images = group[0][0]
            losses.append(value)
            loss_scales.append(float(scaler.get_scale()) if scaler.is_enabled() else 1.0)
            step += 1
            if is_diverged(value, losses[0]):
                status = "diverged"
                break
            if config.checkpoint_every and step % config.checkpoint_every == 0 and replica.is_main:
                ckpt.save(config.checkpoint_dir, step, {  # type: ignore[arg-type]
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(), "rng": torch.get_rng_state()})
            if config.fail_after_step == step:
                os._exit(9)  # test hook: die like a killed process, no clean-up
            if config.eval_every and step % config.eval_every == 0 and step < total_steps:
                whole_model_on_rank_0()
            if config.eval_every and step % config.eval_every == 0 and step < total_steps and replica.is_main:
                evals.append({"step": step, **evaluate(config, model, eval_loader, device)})

    profile = profiler.stop() if profiler is not None else None
    if status == "ok":
        whole_model_on_rank_0()
    result: dict[str, Any] = {"framework": "torch", "status": status, "steps_done": step, "start_step": start,
                              "losses": losses, "loss_scales": loss_scales, "timing": timer.summary(),
                              "recompiles": max(compile_counter() - compiles_before - 1, 0) if config.compile == "compiled" else 0,
                              "graphs_compiled": compile_counter() - compiles_before,
                              "notes": notes, "device": str(device), "torch": torch.__version__,
                              "final_lr": scheduler.get_last_lr()[0]}
    result["replicas"] = data_world
    result["process_index"] = replica.rank  # rank 0 speaks for the run
    if status == "ok" and replica.is_main:
        final = evaluate(config, model, eval_loader, device)
        evals.append({"step": step, **final})
        result["eval"] = final
    result["evals"] = evals
    memory: dict[str, Any] = {}
    if device.type == "cuda":
        memory["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    if first_images is not None and status == "ok" and replica.is_main:
        memory["saved_for_backward_bytes"] = measure_saved_bytes(config, model, first_images, device)
    result["memory"] = memory
    result["synthetic_data"] = train_source.synthetic
    if config.save_weights and status == "ok" and replica.is_main:
        from common.weights import save_torch_keyed

        save_torch_keyed(config.save_weights, {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
                                               if v.is_floating_point()})
    if profile is not None:
        result["profile"] = profile
    parallel.finish(replica)
    return result


def export_initial_weights(config: RunConfig, num_classes: int, path: str) -> None:
    """Writes this config's freshly initialised torch weights as a torch-keyed .npz, so the JAX run
    starts from exactly the same weights (the pairing of every comparison)."""
    from common.weights import save_torch_keyed

    model = make_model(config.replace(init_weights=None), config.arch(num_classes), torch.device("cpu"))
    save_torch_keyed(path, {k: v.float().numpy() for k, v in model.state_dict().items() if v.is_floating_point()})
