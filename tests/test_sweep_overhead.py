"""twinrun sweep (value validation, plans per framework) and twinrun overhead (same model, batches and
first loss as the trainer; the ratio is reported)."""

from __future__ import annotations

import json

import pytest

from common.config import RunConfig
from common.errors import ConfigError
from experiments.__main__ import main
from experiments.catalog.sweeps import SWEEPS
from experiments.execution.plan import sweep_plan


def test_sweep_plans_keep_the_effective_batch_and_say_what_jax_lacks():
    base = RunConfig(batch_size=64, steps=4, epochs=None)
    plan = sweep_plan(SWEEPS["accumulation"], ["1", "4"], base, ("torch", "jax"), repeats=2, preset="cpu")
    assert len(plan) == 12 and len({p.key for p in plan}) == 12  # 2 values + the A/A control, x 2 frameworks x 2
    assert {p.fields["value"] for p in plan if p.fields.get("control") == "aa"} == {"1"}  # the reference once more
    k4 = next(p for p in plan if p.fields["value"] == "4")
    assert (k4.config.grad_accum_steps, k4.config.batch_size) == (4, 16)  # 4 micro-batches of 16 = one 64 batch
    # native mode: torch eager, JAX jit; a compile-mode sweep sets the mode itself, and JAX has no torch modes
    assert {p.framework: p.config.compile for p in plan} == {"torch": "eager", "jax": "compiled"}
    modes = sweep_plan(SWEEPS["compile-mode"], ["eager", "default", "max-autotune"], base, ("torch", "jax"), 1, "cpu")
    assert sorted((p.fields["value"], p.framework) for p in modes if "control" not in p.fields) == [
        ("default", "jax"), ("default", "torch"), ("eager", "jax"), ("eager", "torch"), ("max-autotune", "torch")]
    assert next(p for p in modes if p.fields["value"] == "max-autotune").config.torchcompile_mode == "max-autotune"


def test_bad_sweep_values_are_named_before_any_run(cifar100_archive, tmp_path, capsys):
    common = ["--preset", "tiny", "--data", str(cifar100_archive), "--results", str(tmp_path)]
    assert main(["sweep", "accumulation", "--values", "1", "3", *common]) == 2  # 3 does not divide the batch of 16
    assert "does not divide" in capsys.readouterr().err
    assert main(["sweep", "checkpointing", "--values", "none", "stage9", *common]) == 2
    assert "grad_checkpointing" in capsys.readouterr().err
    assert main(["sweep", "workers", "--values", "two", *common]) == 2
    assert not list(tmp_path.glob("*/runs.jsonl"))  # nothing ran


@pytest.mark.slow
@pytest.mark.e2e
def test_overhead_measures_the_trainer_against_a_minimal_loop(cifar100_archive, tmp_path):
    code = main(["overhead", "--data", str(cifar100_archive), "--model", "resnet10", "--width", "0.125", "--batch-size",
                 "32", "--steps", "8", "--timing-warmup", "2", "--compile", "compiled", "--framework", "jax",
                 "--out", str(tmp_path)])
    assert code == 0
    (result,) = json.loads((tmp_path / "overhead.json").read_text())["results"]
    assert result["status"] == "ok" and result["timed_steps"] == 6
    # the same model, initial weights and first batch on both sides
    assert result["first_loss"]["trainer"] == pytest.approx(result["first_loss"]["minimal"], rel=1e-5)
    assert result["ratio"] == pytest.approx(result["trainer_compute_s"]["median"] / result["minimal_s"]["median"])


def test_overhead_torch_side_and_unsupported_configs(cifar100_archive, tmp_path):
    from experiments.execution.overhead import measure_in_process

    config = RunConfig(data=str(cifar100_archive), model="resnet10", width=0.125, batch_size=32, steps=6, epochs=None,
                       timing_warmup=2, eval_batches=1)
    result = measure_in_process("torch", config)
    assert result["first_loss"]["trainer"] == pytest.approx(result["first_loss"]["minimal"], rel=1e-5)
    assert result["minimal_s"]["n"] == 8  # 4 timed steps before the trainer, 4 after
    with pytest.raises(ConfigError, match="minimal loop"):
        measure_in_process("torch", config.replace(precision="fp16"))
