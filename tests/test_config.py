"""RunConfig: flags (timm's names), TOML, and clear errors."""

from __future__ import annotations

import argparse
import math

import pytest

from common.config import RunConfig
from common.errors import ConfigError
from experiments.cli import add_config_arguments, config_from_args, load_toml


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_timm_style_flags():
    config = _parse(["--amp-dtype", "bf16", "-j", "4", "--grad-accum-steps", "2", "--pin-mem", "--channels-last",
                     "--torchcompile-mode", "max-autotune", "--grad-checkpointing", "2,3", "-b", "64", "--steps", "7"])
    assert (config.precision, config.workers, config.grad_accum_steps, config.pin_mem) == ("bf16", 4, 2, True)
    assert config.channels_last and config.torchcompile_mode == "max-autotune"
    assert config.remat_plan == (2, 3) and config.batch_size == 64  # a ResNet's stages
    assert config.steps == 7 and config.epochs is None


def test_toml_with_sections_and_flag_override(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('model = "resnet34"\n[optimizer]\nlr = 0.2\noptimizer = "adamw"\n[techniques]\nprecision = '
                    '"bf16"\n')
    config = _parse(["--config", str(path), "--lr", "0.3"])
    assert (config.model, config.optimizer, config.precision, config.lr) == ("resnet34", "adamw", "bf16", 0.3)


@pytest.mark.parametrize("values,message", [
    ({"precision": "fp8"}, "unknown precision 'fp8'; known: fp32, bf16, fp16"),
    ({"model": "vgg"}, "unknown model 'vgg'"),
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"precision": "fp16", "grad_accum_steps": 2}, "fp16 with grad_accum_steps > 1"),
    ({"remat": "5"}, "within 1..4"),
    ({"remat": "some"}, "none, all or stage numbers"),
    ({"steps": 5}, "exactly one of steps and epochs"),
    ({"resume": True}, "resume needs checkpoint_dir"),
    ({"inject_inf_at_step": 1}, "needs precision fp16"),
    ({"label_smoothing": 1.5}, "label_smoothing"),
    ({"torchcompile_backend": "aot_eager", "torchcompile_mode": "max-autotune"},
     "torchcompile_mode 'max-autotune' is an inductor mode; torchcompile_backend is 'aot_eager'"),
])
def test_bad_values_are_named(values, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**values)


def test_torch_compile_gets_the_backend_and_only_inductor_a_mode():
    from torch_impl.compilation import compile_options

    assert compile_options(RunConfig(torchcompile_mode="max-autotune")) == {"backend": "inductor",
                                                                            "mode": "max-autotune"}
    assert compile_options(RunConfig(torchcompile_backend="aot_eager")) == {"backend": "aot_eager"}


def test_unknown_keys_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key\\(s\\): colour"):
        RunConfig.from_dict({"colour": "red"})
    with pytest.raises(ConfigError, match="config file not found"):
        load_toml(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("model = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_every_field_declares_its_help_group_and_frameworks_and_the_test_hooks_are_hidden():
    from dataclasses import fields

    from common.config import FRAMEWORKS, GROUPS, TEST_HOOKS, knob_of

    for f in fields(RunConfig):
        declared = knob_of(f)
        assert declared.help and declared.group in (*GROUPS, TEST_HOOKS), f.name
        assert declared.frameworks and set(declared.frameworks) <= set(FRAMEWORKS), f.name
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    text = parser.format_help()
    assert "optimizer:" in text and "precision:" in text and "--grad-checkpointing" in text
    assert "--fail-after-step" not in text and "--inject-inf-at-step" not in text
    assert _parse(["--fail-after-step", "3", "--steps", "5"]).fail_after_step == 3  # hidden, still accepted


def test_toml_with_steps_only_and_an_old_field_name(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('steps = 3\n[techniques]\ngrad_checkpointing = "3,4"\n')
    config = load_toml(path)
    assert (config.steps, config.epochs, config.remat_plan) == (3, None, (3, 4))


@pytest.mark.parametrize("value", [0, -0.1, 1.5, math.nan])
def test_target_accuracy_must_be_a_fraction(value):
    with pytest.raises(ConfigError, match="target_accuracy must be in \\(0, 1\\]"):
        RunConfig(target_accuracy=value)


def test_target_flags_and_synthetic_data():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    config = config_from_args(parser.parse_args(["--to-accuracy", "0.6", "--tensorboard-dir", "tb"]))
    assert (config.target_accuracy, config.tensorboard_dir) == (0.6, "tb")
    assert RunConfig.from_dict({"target_accuracy": 1}).target_accuracy == 1.0
    with pytest.raises(ConfigError, match="target_accuracy needs real labels"):
        RunConfig(source="synthetic", target_accuracy=0.5)


def test_no_effect_notes_of_both_frameworks_come_from_one_table():
    """Issue 27: a setting one framework ignores is noted in that framework's rows, whichever it is; every knob
    declared for one framework only has its reason in the table; both frameworks' flags return the table's notes."""
    from dataclasses import fields

    from common.applicability import TABLE, no_effect_notes
    from common.config import knob_of

    by_field = {rule.field: rule for rule in TABLE}
    for f in fields(RunConfig):
        only = knob_of(f).frameworks
        if len(only) == 1 and not f.name.startswith(("fail_", "inject_")):
            other = {"torch": "jax", "jax": "torch"}[only[0]]
            assert f.name in by_field and other in by_field[f.name].elsewhere, f.name
    config = RunConfig(cudnn_benchmark=True, pin_mem=True, device_prefetch=2, xla_flags="--xla_cpu_use_onednn=true",
                       torchcompile_mode="max-autotune", matmul_precision="high")
    torch_notes, jax_notes = no_effect_notes(config, "torch", "cpu"), no_effect_notes(config, "jax", "cpu")
    assert any(n.startswith("device_prefetch=2: no effect in torch") for n in torch_notes)
    assert any(n.startswith("xla_flags=") and "no effect in torch" in n for n in torch_notes)
    assert any(n.startswith("torchcompile_mode=max-autotune: no effect in jax") for n in jax_notes)
    assert any(n.startswith("cudnn_benchmark=True: no effect here (no CUDA device)") for n in torch_notes)
    assert any(n.startswith("matmul_precision=high: no effect here") for n in jax_notes + torch_notes)
    assert not any("cudnn_benchmark" in n for n in no_effect_notes(config, "torch", "cuda"))
    import torch

    from jax_impl.techniques import apply_flags as jax_flags
    from torch_impl.techniques import apply_flags as torch_flags

    platform = "cuda" if torch.cuda.is_available() else "cpu"  # torch's flags speak of this process's device
    assert torch_flags(config) == no_effect_notes(config, "torch", platform)
    assert jax_flags(config) == jax_notes
    torch_flags(RunConfig())
    jax_flags(RunConfig())  # the process-wide flags back to the defaults
