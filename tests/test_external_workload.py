"""A workload from outside the repository (--model path/to/file.py:NAME or module:NAME): loaded in each process that
names it, built by both frameworks' registries from its own builders, trained on its own data; a framework it
brings no model for is skipped with the reason, and what is wrong with a spec is named. End to end: the example
(examples/mlp_workload.py), copied out of the repository, passes parity and a tiny ladder in both frameworks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common import workloads
from common.config import RunConfig
from common.errors import ConfigError, UnknownFamily
from common.model_options import ModelOptions
from experiments.__main__ import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mlp_workload.py"


@pytest.fixture(autouse=True)
def no_loaded_workloads(monkeypatch):
    monkeypatch.setattr(workloads, "EXTERNAL", {})


@pytest.fixture
def outside(tmp_path) -> Path:
    """The example as a file of a folder outside the repository."""
    return Path(shutil.copy(EXAMPLE, tmp_path / "my_workload.py"))


def test_a_spec_loads_the_workload_and_both_registries_build_its_models(outside):
    import torch

    from jax_impl.models import init_variables
    from jax_impl.models import make_model as make_flax
    from torch_impl.models import make_model as make_torch

    spec = f"{outside}:MLP"
    config = RunConfig(model=spec, image_size=8)  # a spec is a known model: validated by loading it
    assert config.model in workloads.known_models()
    description = workloads.arch(config, 10)
    assert (description.family, description.num_classes) == ("mlp", 10)
    assert make_torch(description, ModelOptions())(torch.zeros(2, 3, 8, 8)).shape == (2, 10)

    flax_model = make_flax(description, ModelOptions())
    assert flax_model.apply(init_variables(flax_model, 0, 8), description.example(2, 8)).shape \
        == (2, 10)
    train, test = workloads.open_sources(config)
    assert (len(train), len(test), train.num_classes) == (512, 128, 10)


def test_a_module_spec_loads_like_a_file(outside, monkeypatch):
    monkeypatch.syspath_prepend(str(outside.parent))
    assert workloads.workload_for("my_workload:MLP").family == "mlp"


def test_a_framework_without_a_model_is_skipped_with_the_reason(outside, capsys, monkeypatch):
    from experiments.execution.frameworks import selected
    from experiments.execution.paired import paired_config
    from torch_impl.models import make_model as make_torch

    monkeypatch.syspath_prepend(str(outside.parent))
    halves = outside.parent / "halves.py"
    halves.write_text("import dataclasses\n\nfrom my_workload import MLP\n\n"
                      "TORCH_ONLY = dataclasses.replace(MLP, flax_model=None)\n"
                      "JAX_ONLY = dataclasses.replace(MLP, torch_model=None)\n")
    torch_only, jax_only = f"{halves}:TORCH_ONLY", f"{halves}:JAX_ONLY"
    assert selected("both", torch_only) == ("torch",)
    assert f"jax: skipped (the workload {torch_only} provides no Flax model)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="takes the family 'mlp' of .*TORCH_ONLY, loaded before"):
        workloads.workload_for(jax_only)
    workloads.EXTERNAL.clear()  # as in a process of its own
    assert selected("both", jax_only) == ("jax",)
    with pytest.raises(ConfigError, match="nothing to run: the workload .* provides no torch model"):
        selected("torch", jax_only)
    config = RunConfig(model=jax_only, image_size=8)
    assert paired_config(config, outside.parent) is config  # no torch weights to start the JAX run from
    with pytest.raises(UnknownFamily, match="no torch model is registered for the family 'mlp'"):
        make_torch(workloads.arch(config, 10), ModelOptions())


@pytest.mark.parametrize("text,error", [
    ("", "no workload file"),
    ("X = 1\n", "has no Workload named MLP"),
    ("from common.workloads import WORKLOADS\nMLP = WORKLOADS['vit']\n", "built-in family name 'vit'"),
])
def test_what_is_wrong_with_a_spec_is_named(tmp_path, text, error):
    path = tmp_path / "bad.py"
    if text:
        path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        workloads.workload_for(f"{path}:MLP")
    with pytest.raises(ConfigError, match="cannot import the workload module 'no_such_module_here'"):
        workloads.workload_for("no_such_module_here:MLP")


@pytest.mark.slow
@pytest.mark.e2e
def test_the_example_passes_parity_and_a_tiny_ladder_in_both_frameworks(outside, tmp_path):
    from experiments.execution.store import ResultStore

    spec = f"{outside}:MLP"
    assert main(["parity", "--model", spec]) == 0
    # no A/A control: its two more runs prove nothing of the workload (the resumed ladder's test runs the control)
    assert main(["ladder", "--preset", "tiny", "--model", spec, "--repeats", "1", "--no-ablations", "--rungs", "flags",
                 "--no-control", "--results", str(tmp_path), "--name", "mlp"]) == 0
    rows = [record for record in ResultStore(tmp_path / "mlp").records() if record.command == "ladder"]
    assert {(r.key.split("/")[2], r.result.status) for r in rows} == {("torch", "ok"), ("jax", "ok")}
    assert all(r.config["model"] == spec for r in rows)
