"""The torch training step and its parts. jax_impl/train.py has the same functions with the same roles
(make_model, make_optimizer, loss_fn, make_train_step, evaluate, measure_saved_bytes), so the two can be read
side by side; torch_impl/backend.py hands them to the one training loop (common/loop.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from common.config import RunConfig
from common.model_options import ModelOptions
from common.schedule import learning_rate
from common.weights import load_torch_keyed, save_torch_keyed
from common.workloads import arch as describe
from torch_impl import models as registry
from torch_impl import parallel, transformer
from torch_impl.techniques import (
    AMP_DTYPES,
    autocast,
    compile_optimizer_step,
    compiled,
    compiles_update,
    count_saved_bytes,
    param_dtype,
)

StepFn = Callable[[list[tuple[torch.Tensor, torch.Tensor]], bool], torch.Tensor]


def build(config: RunConfig, arch: Any) -> torch.nn.Module:
    """The model of ``arch``'s family (the registry, torch_impl/models.py) with the run's techniques set on it."""
    return registry.make_model(arch, ModelOptions.of(config))


def make_model(config: RunConfig, arch: Any, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(config.seed)
    model = build(config, arch)
    if config.init_weights:
        state = model.state_dict()
        for key, value in load_torch_keyed(config.init_weights).items():
            state[key] = torch.from_numpy(value).to(state[key].dtype)
        model.load_state_dict(state)
    return model.to(device=device, dtype=param_dtype(config))


def kernel_notes(config: RunConfig, arch: Any, device: torch.device) -> list[str]:
    """Which attention kernel this run's transformer runs: --attention's choice and, for fused, the backend
    F.scaled_dot_product_attention picks for the run's shapes and dtype on this device (a text encoder's with its
    padding mask, which some backends refuse)."""
    if not arch.attention:
        unused = config.attention != "fused"
        return [f"attention={config.attention}: no effect on {arch.name} (no attention)"] if unused else []
    if config.attention == "naive":
        return ["attention: naive (softmax(QK^T/sqrt(d))V written out, softmax in fp32)"]
    dtype = AMP_DTYPES.get(config.precision, param_dtype(config))
    q = torch.zeros(config.batch_size, arch.heads, arch.tokens, arch.head_dim, device=device, dtype=dtype)
    mask = torch.ones(config.batch_size, arch.tokens, device=device, dtype=torch.bool) if arch.masked else None
    kernel = transformer.fused_kernel(q, q, q, mask)
    masked = " with the padding mask" if mask is not None else ""
    return [f"attention: fused, F.scaled_dot_product_attention ran its {kernel} kernel{masked}"]


def make_optimizer(config: RunConfig, model: torch.nn.Module, total_steps: int):
    """SGD (momentum, coupled weight decay) or AdamW, and the shared LR formula as a LambdaLR. A compiled update
    (``compiles_update``) takes its LR as a tensor, which the scheduler fills in place."""
    lr = torch.tensor(config.effective_lr) if compiles_update(config) else config.effective_lr
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=config.momentum,
                                    weight_decay=config.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=config.weight_decay,
                                      betas=(0.9, 0.999), eps=1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: float(learning_rate(step, config, total_steps, np)) / config.effective_lr)
    if compiles_update(config):  # after the scheduler, which wraps the eager step to see it called
        compile_optimizer_step(optimizer)
    return optimizer, scheduler


def loss_fn(config: RunConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype.
    return F.cross_entropy(logits.to(param_dtype(config)), labels, label_smoothing=config.label_smoothing)


def make_train_step(config: RunConfig, model: torch.nn.Module, optimizer, scheduler, scaler, device) -> StepFn:
    """One optimizer step over k micro-batches: loss / k accumulated by backward, then one update.
    ``model`` may be DDP-wrapped: its gradients are then all-reduced on the last micro-batch only.

    Returns the mean micro-batch loss (a device tensor; the caller synchronizes)."""
    forward = compiled(config, model) if config.compile == "compiled" else model
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
    """Accuracy and mean loss over the evaluation loader's batches (at most ``eval_batches``)."""
    model.eval()
    correct, seen, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for number, (images, labels) in enumerate(loader.epoch(0)):
            if config.eval_batches is not None and number >= config.eval_batches:
                break
            images, labels = to_device(config, images, labels, device)
            with autocast(config, device):
                logits = model(images)
            loss_sum += float(F.cross_entropy(logits.to(param_dtype(config)), labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
    model.train()
    return {"accuracy": correct / seen, "loss": loss_sum / seen, "samples": seen}


def to_device(config: RunConfig, images: torch.Tensor, labels: torch.Tensor, device: torch.device):
    non_blocking = config.pin_mem and device.type == "cuda"
    images = images.to(device, non_blocking=non_blocking)
    if not images.is_floating_point():  # a text batch's token ids: an index, never a value to cast
        return images, labels.to(device, non_blocking=non_blocking)
    images = images.to(param_dtype(config))
    if config.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=non_blocking)


def measure_saved_bytes(config: RunConfig, model: torch.nn.Module, images: torch.Tensor, device) -> int:
    """Bytes saved for backward by one forward pass of the (uncompiled) model on one micro-batch."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with count_saved_bytes() as saved, autocast(config, device):
        model(images).float().sum().backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # the extra pass must not move BatchNorm statistics
    return saved[0]


def export_initial_weights(config: RunConfig, num_classes: int, path: str) -> None:
    """Writes this config's freshly initialised torch weights as a torch-keyed .npz, so the JAX run
    starts from exactly the same weights (the pairing of every comparison)."""
    model = make_model(config.replace(init_weights=None), describe(config, num_classes), torch.device("cpu"))
    save_torch_keyed(path, {k: v.float().numpy() for k, v in model.state_dict().items() if v.is_floating_point()})
