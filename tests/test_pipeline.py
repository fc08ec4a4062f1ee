"""A 2-stage pipeline (GPipe over 2 micro-batches: fewer ticks to compile than the default 4) equals the unsplit
model: torch.distributed.pipelining on 2 gloo processes, JAX shard_map + ppermute on 2 host devices. In fp64, from
the same initial weights, the losses of every step and the trained weights (so every step's gradients) agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import train, weight_gap

from common.config import RunConfig
from common.errors import ConfigError
from experiments.execution.paired import paired_config

TOLERANCE = 1e-9
STEPS = 6
PIPELINED = dict(batch_size=16, pipeline_stages=2, pipeline_micro_batches=2)


def _base(archive: Path, folder: Path, **changes) -> RunConfig:
    config = RunConfig(data=str(archive), width=0.125, steps=STEPS, epochs=None, precision="fp64", eval_batches=1,
                       timing_warmup=1, lr=0.05, compile="compiled", **{"model": "resnet10", **changes})
    return paired_config(config, folder / "weights")


def _train(framework: str, config: RunConfig, path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return train(framework, config.replace(compile="eager") if framework == "torch" else config, path)


@pytest.mark.e2e
@pytest.mark.slow
def test_two_stage_jax_pipeline_equals_the_unsplit_model(cifar100_archive, tmp_path):
    """JAX (torch's pipeline is held to the unsplit model by the BatchNorm test below: equal, at this tolerance, to
    accumulation over the same micro-batches; a GroupNorm run of its own was the same proof twice). The unsplit run
    is torch's, eager: in fp64 it computes JAX's unsplit steps (tests/test_models_parity.py, test_trainers.py's fp64
    trajectory), and a JAX run of its own compiled another fp64 program (~15-20 s here). Measured: losses 1.8e-15 and
    weights 1.6e-15 apart over the 6 steps (2-core AMD EPYC, 2026-12-07), far inside 1e-9."""
    base = _base(cifar100_archive, tmp_path, norm="group")  # GroupNorm: per sample, so micro-batches change nothing
    whole_loss, whole = _train("torch", base.replace(batch_size=16), tmp_path / "whole.npz")
    piped_loss, piped = _train("jax", base.replace(**PIPELINED), tmp_path / "piped.npz")
    assert len(piped_loss) == STEPS
    assert np.abs(whole_loss - piped_loss).max() < TOLERANCE
    assert weight_gap(whole, piped) < TOLERANCE


@pytest.mark.e2e
@pytest.mark.slow
def test_pipeline_batchnorm_is_per_micro_batch_in_both_frameworks(cifar100_archive, tmp_path):
    """With BatchNorm each micro-batch is normalised on its own (running statistics included): torch's pipeline
    equals accumulation over the same 2 micro-batches on the unsplit model, and JAX's pipeline equals torch's."""
    base = _base(cifar100_archive, tmp_path)
    accumulated_loss, accumulated = _train("torch", base.replace(batch_size=8, grad_accum_steps=2),
                                           tmp_path / "accumulated.npz")
    torch_loss, torch_piped = _train("torch", base.replace(**PIPELINED), tmp_path / "torch.npz")
    assert np.abs(accumulated_loss - torch_loss).max() < TOLERANCE
    assert weight_gap(accumulated, torch_piped) < TOLERANCE
    jax_loss, jax_piped = _train("jax", base.replace(**PIPELINED), tmp_path / "jax.npz")
    assert np.abs(torch_loss - jax_loss).max() < 1e-7
    assert weight_gap(torch_piped, jax_piped) < 1e-7


def test_pipeline_combinations_that_are_not_built_are_named():
    with pytest.raises(ConfigError, match="divide batch_size"):
        RunConfig(pipeline_stages=2, batch_size=10)
    with pytest.raises(ConfigError, match="devices > 1"):
        RunConfig(pipeline_stages=2, devices=2)
    with pytest.raises(ConfigError, match="pipeline_stages must be 1 or 2"):
        RunConfig(pipeline_stages=3)
    from jax_impl.mesh import pipeline_mesh

    with pytest.raises(ConfigError, match="compile=compiled"):
        pipeline_mesh(RunConfig(pipeline_stages=2))
