"""The text workload through the driver: a text model reads text by itself (source and generated data), the shapes
sweep plans batching x torch.compile dynamic per framework with the epoch's padding known before it runs and refuses
an image model by name. Its runs and report are checked in the gpu_check script's test (tests/test_ladder.py)."""

from __future__ import annotations

import pytest

from common.config import RunConfig
from common.errors import ConfigError
from experiments.__main__ import build_parser, main
from experiments.catalog.sweeps import SHAPE_VALUES, SWEEPS, checked_values
from experiments.cli import config_from_args
from experiments.execution.plan import PlanOptions, prepare, sweep_plan

FRAMEWORKS = ("torch", "jax")


def test_a_text_model_reads_text_and_an_image_model_images():
    args = build_parser().parse_args(["run", "--model", "text-micro", "--data", "somewhere"])
    assert config_from_args(args).source == "text"  # no --source needed
    with pytest.raises(ConfigError, match="model 'text-micro' reads source text"):
        RunConfig(model="text-micro")
    with pytest.raises(ConfigError, match="model 'resnet18' reads an image source; source is 'text'"):
        RunConfig(model="resnet18", source="text")
    with pytest.raises(ConfigError, match="buckets 'many' not understood"):
        RunConfig(model="text-micro", source="text", buckets="many")
    with pytest.raises(ConfigError, match="compile_dynamic"):
        RunConfig(model="text-micro", source="text", compile_dynamic="sometimes")


def test_the_shapes_sweep_plans_each_strategy_per_framework_with_its_padding(text_folder, tmp_path, capsys):
    prepared = prepare(PlanOptions(preset="tiny", model="text-micro", data=str(text_folder), results=str(tmp_path)),
                       "sweep-shapes")
    assert (prepared.base.source, prepared.base.optimizer) == ("text", "adamw")  # the text family's recipe
    sweep = SWEEPS["shapes"]
    values = checked_values(sweep, sweep.default_values(prepared.base, False), prepared.base, FRAMEWORKS)
    planned = sweep_plan(sweep, values, prepared.base, FRAMEWORKS, 1, "tiny")
    plan = {(p.fields["value"], p.framework): p for p in planned}
    # torch: eager and each torch.compile dynamic setting; JAX: one jit per batching (it has no dynamic setting)
    assert {v for v, f in plan if f == "torch"} == set(SHAPE_VALUES)
    assert {v for v, f in plan if f == "jax"} == {"pad-max", "pad-longest", "bucket"}
    assert plan[("pad-longest:false", "torch")].config.compile_dynamic == "false"
    assert plan[("eager", "torch")].config.compile == "eager"
    assert all(p.config.epochs == 1 and p.config.steps is None for p in plan.values())  # one whole epoch each
    waste = {v: plan[(v, "torch")].fields["padding_waste"] for v in ("pad-max", "pad-longest", "bucket")}
    assert waste["pad-max"] > waste["pad-longest"] > waste["bucket"] > 0
    assert len(plan[("pad-max", "jax")].fields["padded_lengths"]) == 1
    assert plan[("bucket", "jax")].fields["real_tokens"] == plan[("pad-max", "jax")].fields["real_tokens"]
    # an image model has one input shape: refused by name, before any run
    assert main(["sweep", "shapes", "--preset", "tiny", "--results", str(tmp_path)]) == 2
    assert "model 'resnet10' takes inputs of one shape" in capsys.readouterr().err
