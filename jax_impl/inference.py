"""Inference variants on the JAX side; torch_impl/inference.py mirrors them.

Every variant is a callable from a host NHWC float32 batch to host logits (numpy), so the caller times
what a server sees (copy in, forward, copy out; the copy out synchronizes) the same way for both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from common.config import INFERENCE_VARIANTS as VARIANTS
from common.config import RunConfig
from jax_impl.models import BN_EPS
from jax_impl.train import Model
from jax_impl.train import build as build_model
from jax_impl.train import make_model as make_train_model

Predict = Callable[[np.ndarray], np.ndarray]


class Unavailable(Exception):
    """A variant that cannot run here (no maintained path, no GPU): skipped, with the reason."""


def load_model(config: RunConfig, arch: Any, weights: str | None) -> tuple[Model, dict[str, Any]]:
    """The fp32 model and its variables (torch_impl.inference.load_model's mirror; Flax keeps them apart)."""
    return make_train_model(config.replace(init_weights=weights, precision="fp32", remat="none"), arch)


def _conv_of(norm_name: str) -> str:
    return norm_name.replace("bn", "conv")  # bn1 -> conv1, downsample_bn -> downsample_conv


def fold_batchnorm(params: Mapping[str, Any], stats: Mapping[str, Any]) -> dict[str, Any]:
    """Params of the folded model (ResNet(folded_norm=True)): each conv kernel scaled by gamma/sqrt(var+eps)
    per output channel, each BatchNorm reduced to the bias beta - mean * gamma/sqrt(var+eps). In float64,
    then float32, so the folding adds no rounding of its own."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and "scale" in value and name in stats:  # a BatchNorm
            continue
        out[name] = fold_batchnorm(value, stats.get(name, {})) if isinstance(value, Mapping) and name != "fc" else value
    for name, value in params.items():
        if isinstance(value, Mapping) and "scale" in value and name in stats:
            gamma, beta = np.asarray(value["scale"], np.float64), np.asarray(value["bias"], np.float64)
            mean, var = np.asarray(stats[name]["mean"], np.float64), np.asarray(stats[name]["var"], np.float64)
            factor = gamma / np.sqrt(var + BN_EPS)
            conv = _conv_of(name)
            out[conv] = {"kernel": (np.asarray(params[conv]["kernel"], np.float64) * factor).astype(np.float32)}
            out[name] = {"bias": (beta - mean * factor).astype(np.float32)}
    return out


def quantize_int8(params: Mapping[str, Any]) -> dict[str, Any]:
    """Weight-only INT8: every conv/dense kernel as int8 with one fp32 scale per output channel (symmetric,
    max-abs), the rest unchanged. Dequantized inside the jitted forward, which runs in bf16."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping):
            out[name] = quantize_int8(value)
        elif name == "kernel":
            w = np.asarray(value, np.float32)
            scale = np.maximum(np.abs(w).reshape(-1, w.shape[-1]).max(0), 1e-12) / 127.0
            out[name] = {"int8": np.clip(np.round(w / scale), -127, 127).astype(np.int8),
                         "scale": scale.astype(np.float32)}
        else:
            out[name] = value
    return out


def dequantize(params: Mapping[str, Any], dtype: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and set(value) == {"int8", "scale"}:
            out[name] = value["int8"].astype(dtype) * value["scale"].astype(dtype)
        elif isinstance(value, Mapping):
            out[name] = dequantize(value, dtype)
        else:
            out[name] = value
    return out


def _host(fn: Callable[[jax.Array], jax.Array]) -> Predict:
    def predict(images: np.ndarray) -> np.ndarray:
        return np.asarray(fn(jax.device_put(images)), np.float32)  # the copy out waits for the device

    return predict


def _inference_model(config: RunConfig, arch: Any, dtype: str, folded: bool) -> Model:
    """The family's model (jax_impl/train.py's ``build``) in ``dtype`` without remat; ``folded``: a ResNet's
    BatchNorms reduced to biases (its ``folded_norm``)."""
    model = build_model(config.replace(precision=dtype, remat="none"), arch)
    return model.clone(folded_norm=True) if folded else model


def _int8(config: RunConfig, arch: Any, variables: Mapping[str, Any], device: Any) -> tuple[Predict, str]:
    """Weight-only INT8 in a bf16 forward. A model with BatchNorm statistics is folded first (as torch's static
    INT8 fuses conv+BN); one without (a ViT) quantizes its own kernels."""
    stats = variables.get("batch_stats", {})
    bf16 = _inference_model(config, arch, "bf16", folded=bool(stats))
    params = fold_batchnorm(variables["params"], stats) if stats else variables["params"]
    quantized = jax.device_put(quantize_int8(params))

    def int8_forward(images: jax.Array) -> jax.Array:
        return bf16.apply({"params": dequantize(quantized, jnp.bfloat16)}, images).astype(jnp.float32)

    what = "folded, int8 weights" if stats else "int8 weights of every kernel"
    return _host(jax.jit(int8_forward)), (f"{what} (per output channel) dequantized in the jitted forward, bf16 "
                                          f"activations, on {device}")


def build(name: str, config: RunConfig, arch: Any, weights: str | None,
          calibration: list[np.ndarray]) -> tuple[Predict, str]:
    """(predict, what this variant is here) for one of VARIANTS; raises Unavailable to skip it."""
    model, variables = load_model(config, arch, weights)
    device = jax.devices()[0]

    def forward(images: jax.Array) -> jax.Array:
        return model.apply(variables, images, train=False)

    if name == "eager":
        def op_by_op(images: jax.Array) -> jax.Array:
            with jax.disable_jit():
                return forward(images)

        return _host(op_by_op), f"op by op (jax.disable_jit) fp32 on {device}"
    if name == "compiled":
        return _host(jax.jit(forward)), f"jax.jit fp32 on {device}"
    if name == "folded":
        if not variables.get("batch_stats"):
            raise Unavailable("the model has no BatchNorm statistics to fold")
        folded = _inference_model(config, arch, "fp32", folded=True)
        params = jax.device_put(fold_batchnorm(variables["params"], variables["batch_stats"]))
        return _host(jax.jit(lambda images: folded.apply({"params": params}, images))), \
            f"conv+BN folded into the conv weights, jax.jit fp32 on {device}"
    if name == "int8":
        return _int8(config, arch, variables, device)
    if name == "onnxruntime":
        raise Unavailable("no maintained JAX -> ONNX exporter without TensorFlow (jax2tf + tf2onnx); "
                          "JAX's own deployment path is jax.export (StableHLO)")
    if name == "tensorrt":
        raise Unavailable("no TensorRT path from JAX (TensorRT consumes ONNX or torch programs)")
    raise ValueError(f"unknown inference variant '{name}'; known: {', '.join(VARIANTS)}")
