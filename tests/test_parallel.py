"""Data parallel on the frameworks' own engines equals one device on the global batch: torch DDP on 2
gloo processes (torchrun), JAX jit + sharding, shard_map and pmap on 4 host devices. In fp64, the
verification mode, so the comparison is free of fp32's rounding noise floor (tests/test_trainers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import built_once, train, weight_gap

from common.config import RunConfig
from common.errors import ConfigError
from experiments.execution.paired import paired_config, run_framework

TOLERANCE = 1e-9
STEPS = 10


def _base(archive: Path, folder: Path, **changes) -> RunConfig:
    config = RunConfig(data=str(archive), width=0.125, steps=STEPS, epochs=None, precision="fp64", eval_batches=1,
                       timing_warmup=1, lr=0.05, **{"model": "resnet10", **changes})
    return paired_config(config, folder / "weights")  # every run from the same initial weights


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {"norm": "group", "grad_accum_steps": 2},  # GroupNorm: per sample, so no replica statistics
    {"model": "vit-micro"},  # no BatchNorm either
], ids=["resnet10-group-accumulating", "vit-micro"])
def test_torch_ddp_on_two_processes_equals_one_process_on_the_global_batch(cifar100_archive, tmp_path, changes):
    """Each family through the same test (the ViT's was a copy in tests/test_vit_trainers.py). With accumulation,
    DDP skips the all-reduce (no_sync) on all but the last micro-batch: still equal to one process's 16 at once."""
    base = _base(cifar100_archive, tmp_path, **changes)
    accumulation = base.grad_accum_steps
    one_loss, one = train("torch", base.replace(batch_size=16, grad_accum_steps=1), tmp_path / "one.npz")
    ddp_loss, ddp = train("torch", base.replace(batch_size=8 // accumulation, devices=2), tmp_path / "ddp.npz")
    assert len(ddp_loss) == STEPS
    assert np.abs(one_loss - ddp_loss).max() < TOLERANCE
    assert weight_gap(one, ddp) < TOLERANCE


@pytest.mark.multiprocess
@pytest.mark.slow
def test_per_replica_batchnorm_differs_from_the_global_batch_and_matches_across_frameworks(jax_one_device, tmp_path):
    """DDP normalises each replica's half on its own (rank 0's running statistics are kept): not the global
    batch (one device's 16: JAX's run, which equals torch's in fp64, tests/test_trainers.py). JAX's shard_map
    without sync_bn does the same, and the two agree with each other."""
    base, global_loss, _ = jax_one_device
    base = base.replace(compile="eager")  # torch's DDP runs eagerly
    ddp_loss, ddp = train("torch", base.replace(batch_size=8, devices=2), tmp_path / "ddp.npz")
    assert np.abs(global_loss - ddp_loss).max() > 1e-4
    jax_loss, jax_weights = train("jax", base.replace(batch_size=8, devices=2, compile="compiled",
                                                      jax_parallel="shard_map"),
                                   tmp_path / "shard_map.npz")
    assert np.abs(ddp_loss - jax_loss).max() < 1e-7
    assert weight_gap(ddp, jax_weights) < 1e-7


@pytest.fixture(scope="session")
def jax_one_device(cifar100_archive, tmp_path_factory):
    """(base config, losses, weights) of JAX on one device at the global batch of 16: run once for both workers."""

    def build(folder: Path) -> None:
        base = _base(cifar100_archive, folder, compile="compiled")
        losses, _ = train("jax", base.replace(batch_size=16), folder / "one.npz")
        np.save(folder / "losses.npy", losses)
        (folder / "base.json").write_text(json.dumps(base.to_dict()))

    folder = built_once(tmp_path_factory, "jax-one-device", build)
    weights = np.load(folder / "one.npz")
    return (RunConfig.from_dict(json.loads((folder / "base.json").read_text())), np.load(folder / "losses.npy"),
            {k: weights[k] for k in weights.files})


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["sharding", "shard_map", "pmap"])
def test_jax_data_parallel_on_four_devices_equals_one_device(jax_one_device, tmp_path, mode):
    # BatchNorm over the global batch: implicit under jit + sharding, sync_bn (axis_name) under shard_map / pmap.
    # Issue 27: the memory and compile fields torch's DDP rows have, under every JAX engine (pmap's programs
    # counted from the compilations its calls made: it has no jit cache)
    base, one_loss, one = jax_one_device
    path = tmp_path / f"{mode}.npz"
    result = run_framework("jax", base.replace(batch_size=4, devices=4, jax_parallel=mode, sync_bn=mode != "sharding",
                                               save_weights=str(path)))
    assert result.status == "ok", result.error
    par = dict(np.load(path))
    assert np.abs(one_loss - np.asarray(result.losses)).max() < TOLERANCE
    assert weight_gap(one, par) < TOLERANCE
    assert result.memory.saved_for_backward_bytes > 0 and result.graphs_compiled >= 1 and result.recompiles == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_jax_on_two_processes_killed_and_resumed_ends_where_one_device_does(jax_one_device, tmp_path):
    """jax.distributed on localhost: 2 processes with 2 host devices each, every process loading its own half
    of the global batch, orbax checkpoints from both. Killed after step 7, the rerun resumes from step 6: its
    losses and final weights are one device's."""
    base, one_loss, one = jax_one_device
    spread = base.replace(batch_size=4, devices=4, processes=2, checkpoint_dir=str(tmp_path / "checkpoints"),
                          checkpoint_every=3)
    killed = run_framework("jax", spread.replace(fail_after_step=7))
    assert killed.status == "failed" and "exit code 9" in killed.error
    resumed_loss, resumed = train("jax", spread.replace(resume=True), tmp_path / "resumed.npz")
    assert len(resumed_loss) == STEPS - 6
    assert np.abs(one_loss[6:] - resumed_loss).max() < TOLERANCE
    assert weight_gap(one, resumed) < TOLERANCE


def test_absent_devices_and_cpu_syncbatchnorm_are_named(monkeypatch):
    import torch

    from jax_impl.parallel import DataParallel
    from torch_impl import parallel as torch_parallel

    with pytest.raises(ConfigError, match="xla_force_host_platform_device_count"):
        DataParallel.create(RunConfig(devices=64, compile="compiled"))
    monkeypatch.setattr(torch_parallel, "current_device", lambda: torch.device("cpu"))  # as on a CPU host
    with pytest.raises(ConfigError, match="SyncBatchNorm runs on GPUs only"):
        torch_parallel.start(RunConfig(sync_bn=True))
    with pytest.raises(ConfigError, match="needs 2 processes"):
        torch_parallel.start(RunConfig(devices=2))
    with pytest.raises(ConfigError, match="sync_bn"):
        RunConfig(norm="group", sync_bn=True)
    with pytest.raises(ConfigError, match="multiple of processes"):
        RunConfig(devices=3, processes=2)
    with pytest.raises(ConfigError, match="pmap across processes"):
        RunConfig(devices=2, processes=2, jax_parallel="pmap")


@pytest.mark.multiprocess
def test_jax_processes_without_a_coordinator_are_named(cifar100_archive, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COORDINATOR_ADDRESS", "TWINRUN_PROCESS_ID")}
    proc = subprocess.run([sys.executable, "-m", "experiments", "train", "--framework", "jax", "--data",
                           str(cifar100_archive),
                           "--devices", "2", "--processes", "2", "--compile", "compiled", "--steps", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "jax.distributed could not start" in proc.stderr and "JAX_COORDINATOR_ADDRESS" in proc.stderr
