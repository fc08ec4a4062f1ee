"""The learning-rate formula both frameworks evaluate: torch on the host (numpy), JAX traced (jax.numpy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.config import RunConfig


def learning_rate(step: Any, config: RunConfig, total_steps: int, np_like: Any) -> Any:
    """The LR at optimizer step ``step`` (0-based), one formula for both frameworks: linear warm-up from
    lr/warmup to lr, then cosine (or constant) down to min_lr. ``np_like`` is numpy (torch side, host) or
    jax.numpy (traced inside the optax schedule)."""
    base = config.effective_lr
    # fp64 (the verification mode; JAX runs it with x64 on) evaluates the formula in fp64: in fp32 numpy's and XLA's
    # cos differ by an ulp at some steps, an LR gap of up to 2e-6 that showed as a 1e-9 loss gap in the paired
    # fp64 ViT trajectory (tests/test_vit_trainers.py)
    step = np_like.asarray(step, dtype=np_like.float64 if config.precision == "fp64" else np_like.float32)
    warmup = max(config.warmup_steps, 0)
    warm = np_like.minimum((step + 1.0) / max(warmup, 1), 1.0) if warmup else 1.0
    if config.schedule == "constant":
        return base * warm
    decay_steps = max(total_steps - warmup, 1)
    progress = np_like.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = config.min_lr + (base - config.min_lr) * 0.5 * (1.0 + np_like.cos(np_like.pi * progress))
    return np_like.where(step < warmup, base * warm, cosine)
