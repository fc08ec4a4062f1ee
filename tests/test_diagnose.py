"""twinrun diagnose: a planted slow loader is input-bound and a large model on a fast loader compute-bound,
in both frameworks; the thresholds of the verdict on their own; the profiler traces are written."""

from __future__ import annotations

import pytest

from common.config import RunConfig
from experiments.execution.diagnosis import classify, diagnose


def test_verdict_thresholds():
    assert classify(data_wait_fraction=0.6, doubling_ratio=1.0) == "input-bound"
    assert classify(data_wait_fraction=0.05, doubling_ratio=1.95) == "compute-bound"
    assert classify(data_wait_fraction=0.05, doubling_ratio=1.1) == "overhead-bound"
    assert classify(data_wait_fraction=0.05, doubling_ratio=1.45) == "compute-bound"  # CPU kernels gain with batch
    # a GPU idle half the time with no data wait: overhead, whatever the doubling says
    assert classify(data_wait_fraction=0.05, doubling_ratio=1.9, gpu_utilisation_median=30.0) == "overhead-bound"


def _config(archive, framework: str, **changes) -> RunConfig:
    # Each framework in its usual mode: torch eager, JAX jit (op by op, JAX is overhead-bound at any size here).
    return RunConfig(data=str(archive), steps=5, epochs=None, timing_warmup=2, eval_batches=1,
                     compile="compiled" if framework == "jax" else "eager", **changes)


@pytest.mark.serial
@pytest.mark.e2e
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_planted_slow_loader_is_input_bound(cifar100_archive, tmp_path, framework):
    # PNG decode in the main process (0 workers) behind 60 ms of simulated storage latency per batch,
    # feeding a very small model (at 30 ms one torch run here measured a wait fraction of 0.36: too near the line).
    config = _config(cifar100_archive, framework, png=True, workers=0, read_latency_ms=60.0, model="resnet10",
                     width=0.0625, batch_size=32)
    found = diagnose(framework, config, tmp_path)
    assert found.verdict == "input-bound", found.evidence
    assert found.data_wait_fraction > 0.4
    assert found.profile is not None and found.profile["top_ops"] and found.profile["steps"] == 3
    assert (tmp_path / framework / "profile").is_dir()
    assert any("NVML" in line or "GPU utilisation" in line for line in found.evidence)


@pytest.mark.serial
@pytest.mark.e2e
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_large_model_on_a_fast_loader_is_compute_bound(cifar100_archive, tmp_path, framework):
    # 5 timed steps a batch size (8 - 2 warm-up - 1 traced): the doubling ratio is a ratio of medians, so one
    # slow step cannot flip it (with 3 timed JAX steps one run in several fell below the line here). Width 1/4:
    # x2.04-2.19 (JAX) and x1.93-2.02 (torch) in two runs each here, clear of the line (x1.4) and of the re-measured
    # band (x1.15-1.7), in 29-32 and 18-20 s; width 1/2 read x3.20 and x2.10 in 51 and 26 s (2-core AMD EPYC, alone,
    # 2026-12-07)
    config = _config(cifar100_archive, framework, workers=0, width=0.25, batch_size=32).replace(steps=8)
    found = diagnose(framework, config, tmp_path, profile_steps=1)
    assert found.verdict == "compute-bound", found.evidence
    assert found.data_wait_fraction < 0.1 and found.doubling_ratio > 1.4


def test_a_device_that_is_absent_is_not_needed(cifar100_archive):
    from experiments.execution.diagnosis import GpuSampler

    with GpuSampler() as sampler:  # no GPU here: a clear note, no crash
        pass
    assert sampler.summary() is None and sampler.unavailable


def test_a_doubling_ratio_near_the_line_is_measured_again_and_the_faster_medians_kept(monkeypatch, tmp_path):
    # The CI run that read x1.26 for a compute-bound model: its run at B was slowed as a whole (368 ms where
    # 222-230 ms is usual). Measured again, the faster median of each size gives the true ratio.
    from types import SimpleNamespace

    from experiments.execution import diagnosis

    medians = iter([(32, 0.368), (64, 0.465), (32, 0.230), (64, 0.420)])

    def fake_run(framework, config, timeout_s):
        batch, median = next(medians)
        assert config.batch_size == batch
        timing = SimpleNamespace(data_wait_fraction=0.01, step_median_s=median)
        return SimpleNamespace(timing=timing, profile=None, device="cpu"), SimpleNamespace(median=median)

    monkeypatch.setattr(diagnosis, "_run", fake_run)
    monkeypatch.setattr(diagnosis, "paired_config", lambda config, folder: config)
    found = diagnose("torch", RunConfig(batch_size=32, steps=8, epochs=None), tmp_path)
    assert found.verdict == "compute-bound" and found.doubling_ratio == pytest.approx(0.420 / 0.230)
    assert "measured twice" in found.evidence[1] and "x1.26" in found.evidence[1]
    assert next(medians, None) is None  # all four runs were made
