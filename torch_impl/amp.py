"""Mixed precision on the torch side: autocast around the model and GradScaler's loss scaling (fp16);
jax_impl/amp.py is the JAX twin (a compute dtype and a LossScale in the train state)."""

from __future__ import annotations

import contextlib

import torch

from common.config import RunConfig

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch autocast for bf16/fp16; the loss is computed on fp32 logits outside the cast ops."""
    if config.precision in ("fp32", "fp64"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[config.precision])


def make_grad_scaler(config: RunConfig, device: torch.device) -> torch.amp.GradScaler:
    """GradScaler belongs to fp16 only (bf16 has fp32's exponent range): disabled otherwise."""
    return torch.amp.GradScaler(device.type, init_scale=config.loss_scale_init,
                                growth_interval=config.loss_scale_growth_interval,
                                enabled=config.precision == "fp16")
