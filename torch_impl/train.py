"""The torch training step and its parts. jax_impl/train.py has the same functions with the same parameters
(tests/test_twins.py checks it), so the two can be read side by side; torch_impl/backend.py hands them to the one
training loop (common/loop.py).

A model lives on this process's device (torch_impl/data.py's ``current_device``) from ``make_model`` on, and the
functions here read the device from its parameters: none takes a device of its own, as JAX's take none."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from common.config import RunConfig
from common.model_options import ModelOptions
from common.schedule import learning_rate
from common.weights import check_torch_keys, load_torch_keyed, save_torch_keyed
from common.workloads import arch as describe
from torch_impl import models as registry
from torch_impl import transformer
from torch_impl.amp import AMP_DTYPES, autocast, make_grad_scaler
from torch_impl.compilation import compile_optimizer_step, compiled, compiles_update
from torch_impl.data import current_device, to_device
from torch_impl.techniques import param_dtype

# (images, labels, inject_inf) -> the micro-batch's loss; every k-th call updates (JAX's optax.MultiSteps' rhythm)
StepFn = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


class Optimizer(NamedTuple):
    """What the step updates with (jax_impl/train.py's twin): the optimizer, the LR schedule as a LambdaLR and the fp16
    loss scale (GradScaler), each holding its own state, as torch's objects do."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def build(config: RunConfig, arch: Any) -> torch.nn.Module:
    """The model of ``arch``'s family (the registry, torch_impl/models.py) with the run's techniques set on it."""
    return registry.make_model(arch, ModelOptions.of(config))


def make_model(config: RunConfig, arch: Any) -> torch.nn.Module:
    return _make_model(config, arch, current_device())


def _make_model(config: RunConfig, arch: Any, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(config.seed)
    model = build(config, arch)
    if config.init_weights:
        state, loaded = model.state_dict(), load_torch_keyed(config.init_weights)
        check_torch_keys(loaded, state, config.init_weights)
        for key, value in loaded.items():
            state[key] = torch.from_numpy(value).to(state[key].dtype)
        model.load_state_dict(state)
    return model.to(device=device, dtype=param_dtype(config))


def kernel_notes(config: RunConfig, arch: Any) -> list[str]:
    """Which attention kernel this run's transformer runs: --attention's choice and, for fused, the backend
    F.scaled_dot_product_attention picks for the run's shapes and dtype on this device (a text encoder's with its
    padding mask, which some backends refuse)."""
    if not arch.attention:
        unused = config.attention != "fused"
        return [f"attention={config.attention}: no effect on {arch.name} (no attention)"] if unused else []
    if config.attention == "naive":
        return ["attention: naive (softmax(QK^T/sqrt(d))V written out, softmax in fp32)"]
    dtype, device = AMP_DTYPES.get(config.precision, param_dtype(config)), current_device()
    q = torch.zeros(config.batch_size, arch.heads, arch.tokens, arch.head_dim, device=device, dtype=dtype)
    mask = torch.ones(config.batch_size, arch.tokens, device=device, dtype=torch.bool) if arch.masked else None
    kernel = transformer.fused_kernel(q, q, q, mask)
    masked = " with the padding mask" if mask is not None else ""
    return [f"attention: fused, F.scaled_dot_product_attention ran its {kernel} kernel{masked}"]


def make_optimizer(config: RunConfig, model: torch.nn.Module, total_steps: int) -> Optimizer:
    """SGD (momentum, coupled weight decay) or AdamW, the shared LR formula as a LambdaLR and the GradScaler. A
    compiled update (``compiles_update``) takes its LR as a tensor, which the scheduler fills in place, and runs
    the optimizer's fused kernel (one call over every parameter, as XLA fuses JAX's update), which dynamo traces as
    one op: a cold compile of the tiny preset's whole step took 50 s with it, 70 s with the per-parameter foreach
    update, 46 s for the model alone (one run each, 2-core AMD EPYC, 2026-12-07). Eager runs keep the default
    (foreach) implementation."""
    update = compiles_update(config)
    lr = torch.tensor(config.effective_lr) if update else config.effective_lr
    fused = True if update else None
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=config.momentum,
                                    weight_decay=config.weight_decay, fused=fused)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=config.weight_decay,
                                      betas=(0.9, 0.999), eps=1e-8, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: float(learning_rate(step, config, total_steps, np)) / config.effective_lr)
    if compiles_update(config):  # after the scheduler, which wraps the eager step to see it called
        compile_optimizer_step(optimizer, config.torchcompile_backend)
    return Optimizer(optimizer, scheduler, make_grad_scaler(config, _device_of(model)))


def loss_fn(config: RunConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype.
    return F.cross_entropy(logits.to(param_dtype(config)), labels, label_smoothing=config.label_smoothing)


def make_train_step(config: RunConfig, model: torch.nn.Module, optimizer: Optimizer) -> StepFn:
    """One micro-batch step: its loss / k accumulated by backward, and on every k-th call one update (as
    optax.MultiSteps does in JAX's step). ``model`` may be DDP-wrapped: its gradients are then all-reduced on the k-th
    call only.

    Returns the micro-batch's loss (a device tensor; the caller synchronizes)."""
    forward = compiled(config, model) if config.compile == "compiled" else model
    k = config.grad_accum_steps
    device = _device_of(model)
    update, scheduler, scaler = optimizer
    calls = [0]

    def step(images: torch.Tensor, labels: torch.Tensor, inject_inf: bool = False) -> torch.Tensor:
        first, last = calls[0] % k == 0, calls[0] % k == k - 1
        calls[0] += 1
        if first:
            update.zero_grad(set_to_none=True)
        with _no_sync(model, last):
            with autocast(config, device):
                logits = forward(images)
            loss = loss_fn(config, logits, labels)
            scaler.scale(loss / k).backward()
        if not last:
            return loss.detach()
        if inject_inf:  # test hook: an overflowing gradient, as fp16 produces
            next(model.parameters()).grad.fill_(float("inf"))
        scale_before = scaler.get_scale()
        scaler.step(update)
        scaler.update()
        # A step the scaler skipped is no optimizer step: the schedule stays where it is (as in JAX).
        if not (scaler.is_enabled() and scaler.get_scale() < scale_before):
            scheduler.step()
        return loss.detach()

    return step


def _no_sync(model: torch.nn.Module, last_micro_batch: bool) -> contextlib.AbstractContextManager:
    """Accumulation under DDP: gradients are all-reduced once per optimizer step, on the last micro-batch only."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return model.no_sync()
    return contextlib.nullcontext()


def evaluate(config: RunConfig, model: torch.nn.Module, loader) -> dict[str, float]:
    """Accuracy and mean loss over the evaluation loader's batches (at most ``eval_batches``)."""
    device = _device_of(model)
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


def measure_saved_bytes(config: RunConfig, model: torch.nn.Module, images: torch.Tensor,
                        labels: torch.Tensor) -> int:
    """Bytes saved for backward by one forward and loss of the (uncompiled) model on one micro-batch: the model's
    activations and the loss's softmax (batch x classes), as JAX's twin counts the residuals of the same loss."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with _count_saved_bytes() as saved:
        with autocast(config, _device_of(model)):
            logits = model(images)
        loss_fn(config, logits, labels).backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # the extra pass must not move BatchNorm statistics
    return saved[0]


def export_initial_weights(config: RunConfig, num_classes: int, path: str) -> None:
    """Writes this config's freshly initialised torch weights as a torch-keyed .npz, so the JAX run
    starts from exactly the same weights (the pairing of every comparison)."""
    # on the CPU whatever the process's device: the weights are written from there (no CUDA started for them)
    model = _make_model(config.replace(init_weights=None), describe(config, num_classes), torch.device("cpu"))
    save_torch_keyed(path, {k: v.float().numpy() for k, v in model.state_dict().items() if v.is_floating_point()})


@contextlib.contextmanager
def _count_saved_bytes() -> Iterator[list[int]]:
    """Bytes autograd saves for the backward pass while the block runs (what checkpointing reduces)."""
    total = [0]
    seen: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else id(tensor)
        if key not in seen:  # several ops may save views of one storage
            seen.add(key)
            total[0] += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total
