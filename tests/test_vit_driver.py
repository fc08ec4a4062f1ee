"""Every driver command takes ``--model vit-*`` through the workload seam (common/workloads.py): the ladder and the
sweeps adapt the preset by family data (AdamW for a ViT), the checkpointing sweep takes the family's own choices, the
attention sweep refuses a model without attention by name, and infer, overhead and diagnose run a ViT, skipping
what means nothing for it (BatchNorm folding) with the reason."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from common.errors import ConfigError
from experiments.__main__ import main
from experiments.catalog.presets import model_tag, preset_settings
from experiments.catalog.sweeps import SWEEPS, checked_values
from experiments.execution.plan import PlanOptions, prepare, sweep_plan

FRAMEWORKS = ("torch", "jax")


def _rows(path: Path, command: str) -> list[dict]:
    """The rows of one command in a results folder's runs.jsonl export."""
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("command") == command]


def test_a_preset_adapts_to_a_model_of_another_family_by_data():
    vit = preset_settings("tiny", "vit-tiny")
    assert (vit["model"], vit["optimizer"], vit["lr"], vit["weight_decay"]) == ("vit-tiny", "adamw", 1e-3, 0.05)
    assert vit["batch_size"] == preset_settings("tiny")["batch_size"]  # the preset's schedule stays
    resnet50 = preset_settings("tiny", "resnet50")  # the preset's family: its own recipe, only the model changes
    assert (resnet50["model"], resnet50.get("optimizer", "sgd"), resnet50["lr"]) == ("resnet50", "sgd", 0.05)
    # the preset's own model (the tiny preset's ResNet-10) adds no tag; another ResNet does
    tags = [model_tag("tiny", m) for m in ("vit-tiny", "resnet10", None, "resnet18")]
    assert tags == ["-vit-tiny", "", "", "-resnet18"]
    with pytest.raises(ConfigError, match="unknown model 'vit-xl'"):
        preset_settings("tiny", "vit-xl")


def test_the_checkpointing_sweep_takes_the_family_choices_and_attention_refuses_a_resnet(cifar100_archive, tmp_path,
                                                                                        capsys):
    prepared = prepare(PlanOptions(preset="tiny", model="vit-tiny", data=str(cifar100_archive),
                                   results=str(tmp_path)), "sweep-checkpointing-tiny-vit-tiny")
    sweep = SWEEPS["checkpointing"]
    values = checked_values(sweep, sweep.default_values(prepared.base, False), prepared.base, FRAMEWORKS)
    assert values == ["none", "attention", "1,2,3", "all"]  # vit-tiny has 6 blocks: the first half is 1..3
    plan = sweep_plan(sweep, values, prepared.base, FRAMEWORKS, repeats=1, preset="tiny")
    assert {(p.config.remat, p.framework) for p in plan} == {(v, f) for v in values for f in FRAMEWORKS}
    assert {p.config.optimizer for p in plan} == {"adamw"}
    kernels = sweep_plan(SWEEPS["attention"], ["naive", "fused"], prepared.base, FRAMEWORKS, 1, "tiny")
    assert sorted({p.config.attention for p in kernels}) == ["fused", "naive"]
    # a ResNet has no attention: refused by its name before any run, and nothing is written
    common = ["--preset", "tiny", "--data", str(cifar100_archive), "--results", str(tmp_path)]
    assert main(["sweep", "attention", *common]) == 2
    assert "model 'resnet10' has no attention" in capsys.readouterr().err
    assert main(["sweep", "checkpointing", "--model", "vit-micro", "--values", "3", *common]) == 2  # 2 blocks
    assert "blocks must be within 1..2" in capsys.readouterr().err
    assert not list(tmp_path.glob("*/runs.jsonl"))


def test_the_ladder_plans_every_rung_of_a_vit_in_both_frameworks_with_its_family_recipe(cifar100_archive, tmp_path):
    """A plan, tested as a plan: every rung in both frameworks, AdamW at the ViT's LR, one set of initial weights for
    both frameworks, and a folder named after the model. (The ladder's every rung runs end to end for the ResNet in
    tests/test_ladder.py::test_gpu_check_script_runs_the_tiny_preset_on_cpu, the ViT through the driver in that
    script's ViT sweeps, with the recipe and the fused attention's note checked on their rows.)"""
    from experiments.catalog.rungs import DEFAULT_ORDER, Device
    from experiments.commands.ladder import _default_name
    from experiments.execution.plan import LadderOptions, ladder_plan, with_paired_weights

    args = argparse.Namespace(preset="tiny", model="vit-micro", to_accuracy=None, epochs=None)
    assert _default_name(args, DEFAULT_ORDER) == "ladder-tiny-vit-micro"  # never mixed with the ResNet's rows
    assert _default_name(args, ("compile",)) == "ladder-tiny-vit-micro-compile"
    prepared = with_paired_weights(prepare(PlanOptions(preset="tiny", model="vit-micro", data=str(cifar100_archive),
                                                       results=str(tmp_path), repeats=1), "ladder-tiny-vit-micro"))
    plan = ladder_plan(prepared, 1, "tiny", LadderOptions(Device(cuda=False, workers=2), ablations=False))
    runs = [job for job in plan if "control" not in job.fields]
    assert {(job.fields["rung"], job.framework) for job in runs} == {(rung, f) for rung in ("baseline", *DEFAULT_ORDER)
                                                                    for f in FRAMEWORKS}
    assert {(job.config.model, job.config.optimizer, job.config.lr) for job in plan} == {("vit-micro", "adamw", 1e-3)}
    assert len({job.config.init_weights for job in plan}) == 1  # both frameworks from the same weights


def _infer_rows(folder: Path) -> dict[tuple[str, str], dict]:
    return {(r["framework"], r["variant"]): r for r in _rows(folder / "runs.jsonl", "infer")}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_infer_runs_a_vit_and_skips_folding_with_its_reason(cifar100_archive, tmp_path):
    code = main(["infer", "--model", "vit-micro", "--data", str(cifar100_archive), "--train-epochs", "0",
                 "--variants", "eager", "folded", "int8", "onnxruntime", "--calls", "5", "--warmup", "1",
                 "--throughput-batches", "8", "--throughput-calls", "2", "--calibration-batches", "1",
                 "--eval-batches", "1", "--out", str(tmp_path)])
    assert code == 0
    rows = _infer_rows(tmp_path)
    for framework in FRAMEWORKS:
        assert rows[(framework, "eager")]["status"] == "ok" and rows[(framework, "int8")]["status"] == "ok"
        folded = rows[(framework, "folded")]
        assert folded["status"] == "skipped" and "has no BatchNorm" in folded["note"]
    assert rows[("torch", "int8")]["method"] == rows[("jax", "int8")]["method"]  # one method, both frameworks
    assert rows[("torch", "onnxruntime")]["status"] == "ok"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_overhead_runs_a_vit_in_both_frameworks_on_a_ten_class_data_set(cifar10_archive, tmp_path):
    """Each framework in its usual mode (torch eager, JAX jit): the minimal loop has no batch_stats to carry, and
    builds the trainer's 10-class model from the same weights (the same first loss)."""
    common = ["--model", "vit-micro", "--source", "cifar10", "--data", str(cifar10_archive), "--batch-size", "16",
              "--steps", "4", "--timing-warmup", "1"]
    for framework, mode in (("torch", "eager"), ("jax", "compiled")):
        out = tmp_path / framework
        assert main(["overhead", "--framework", framework, "--compile", mode, *common, "--out", str(out)]) == 0
        (result,) = json.loads((out / "overhead.json").read_text())["results"]
        assert result["status"] == "ok" and result["timed_steps"] == 3 and result["num_classes"] == 10
        assert result["first_loss"]["trainer"] == pytest.approx(result["first_loss"]["minimal"], rel=1e-5)
