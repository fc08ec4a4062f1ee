"""One name, one computation: each INT8 variant is the same method in both frameworks (common/inference.py). The
weight-only "int8" of both sides holds the same integers for the same (transferred) weights and so computes the
same function; "int8-dynamic" quantizes the same layers' activations at each call on both sides; "int8-static" runs
where a framework has the path and is skipped with the reason where it has not. Each stays near its fp32 logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.inference import METHODS, VARIANTS, int8_per_channel
from common.workloads import arch
from experiments.execution.frameworks import module

FAMILIES = {"resnet18": RunConfig(model="resnet18", width=0.125), "vit-micro": RunConfig(model="vit-micro"),
            "text-micro": RunConfig(model="text-micro", source="text", max_len=32)}
CLASSES = 10


def test_int8_per_channel_scales_each_output_channel_by_its_own_largest_weight():
    w = np.array([[[0.5, -1.0], [0.25, 0.0]], [[3.0, 1.5], [-0.75, 0.1]]], np.float32)  # channel axis 0
    q, scale = int8_per_channel(w, channel_axis=0)
    np.testing.assert_allclose(scale, [1.0 / 127, 3.0 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0, 0, 1] == -127 and q[1, 0, 0] == 127
    assert np.abs(q * scale.reshape(2, 1, 1) - w).max() <= scale.max() / 2 + 1e-7  # rounding: half a step
    moved, moved_scale = int8_per_channel(np.moveaxis(w, 0, -1), channel_axis=-1)  # Flax's layout: channels last
    np.testing.assert_array_equal(np.moveaxis(moved, -1, 0), q)
    np.testing.assert_array_equal(moved_scale, scale)
    q0, _ = int8_per_channel(np.zeros((3, 4), np.float32), channel_axis=0)  # an all-zero channel stays zero
    assert not q0.any()


def test_every_variant_names_its_method_once():
    assert set(METHODS) == set(VARIANTS) and all(METHODS[v] for v in VARIANTS)
    assert "weight-only int8" in METHODS["int8"] and "activations quantized at each call" in METHODS["int8-dynamic"]


def _inputs(config: RunConfig) -> np.ndarray:
    rng = np.random.default_rng(0)
    if config.model.startswith("text"):
        tokens = rng.integers(3, 200, size=(4, config.max_len)).astype(np.int32)
        tokens[:, 0] = 1  # CLS first, as the batch maker writes it
        return tokens
    return rng.random((4, 32, 32, 3), dtype=np.float32)


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> dict[str, str]:
    """Each family's fresh torch weights as a torch-keyed .npz: both frameworks infer with the same weights."""
    folder = Path(tmp_path_factory.mktemp("weights"))
    out = {}
    for name, config in FAMILIES.items():
        out[name] = str(folder / f"{name}.npz")
        module("torch", "train").export_initial_weights(config, CLASSES, out[name])
    return out


def _build(framework: str, variant: str, name: str, weights: dict[str, str]):
    config = FAMILIES[name]
    calibration = [_inputs(config)]
    predict, note = module(framework, "inference").build(variant, config, arch(config, CLASSES), weights[name],
                                                         calibration)
    return predict, note


@pytest.mark.parametrize("name", FAMILIES)
def test_weight_only_int8_is_one_function_in_both_frameworks(name, weights):
    """The same integers and scales dequantized in an fp32 forward: torch's and JAX's int8 logits agree as closely
    as their fp32 logits do (tests/test_models_parity.py), and stay near fp32."""
    x = _inputs(FAMILIES[name])
    logits = {f: _build(f, "int8", name, weights)[0](x) for f in ("torch", "jax")}
    reference = _build("torch", "eager", name, weights)[0](x)
    spread = np.abs(reference).max()
    assert np.abs(logits["torch"] - logits["jax"]).max() < 1e-4 * spread + 1e-5
    assert np.abs(logits["torch"] - reference).max() < 0.05 * spread  # int8 rounding, not another model
    assert np.abs(logits["torch"] - reference).max() > 0  # and it did quantize


@pytest.mark.parametrize("name", ["vit-micro", "text-micro"])
def test_dynamic_int8_quantizes_the_dense_layers_per_call_in_both_frameworks(name, weights):
    """Activations are quantized at each call (torch: asymmetric uint8 per tensor; qwix: symmetric int8 per tensor),
    so the two frameworks differ by a rounding step, not by a method: both near fp32, near each other."""
    x = _inputs(FAMILIES[name])
    reference = _build("torch", "eager", name, weights)[0](x)
    spread = np.abs(reference).max()
    logits = {f: _build(f, "int8-dynamic", name, weights)[0](x) for f in ("torch", "jax")}
    for framework, got in logits.items():
        gap = np.abs(got - reference).max()
        assert 0 < gap < 0.15 * spread, framework
    assert np.abs(logits["torch"] - logits["jax"]).max() < 0.2 * spread


def test_static_int8_runs_where_the_framework_has_it_and_is_skipped_with_the_reason_elsewhere(weights):
    x = _inputs(FAMILIES["resnet18"])
    static, note = _build("torch", "int8-static", "resnet18", weights)
    reference = _build("torch", "eager", "resnet18", weights)[0](x)
    assert np.abs(static(x) - reference).max() < 0.15 * np.abs(reference).max() and "FX static" in note
    jax_inference = module("jax", "inference")
    with pytest.raises(jax_inference.Unavailable, match="no static"):
        _build("jax", "int8-static", "resnet18", weights)
    torch_inference = module("torch", "inference")
    with pytest.raises(torch_inference.Unavailable, match="cannot trace"):
        _build("torch", "int8-static", "vit-micro", weights)
