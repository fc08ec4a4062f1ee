"""Inference variants on the JAX side; torch_impl/inference.py mirrors them.

Every variant is a callable from a host batch (NHWC float32 images, or int32 tokens (batch, length) padded with 0)
to host logits (numpy), so the caller times what a server sees (copy in, forward, copy out; the copy out
synchronizes) the same way for both sides. A jitted variant compiles one program per input shape: with text, one per
distinct padded length (the config's batching decides how many), counted by ``compile_counts``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from common.config import RunConfig
from common.inference import VARIANTS, dequantize_shape, int8_per_channel
from jax_impl.models import BN_EPS
from jax_impl.train import Model, Module
from jax_impl.train import build as build_model
from jax_impl.train import make_model as make_train_model

Predict = Callable[[np.ndarray], np.ndarray]

# INT4 weight-only, torch_impl/inference.py's twin: qwix (Google's JAX quantization library) post-training
# quantization of every dot's weight to int4, one scale per INT4_GROUP input channels; where the description says
# ``int4`` (the text encoder).
INT4_GROUP = 32
QWIX_PIP = "pip install qwix==0.1.8"  # the version checked against jax 0.10.2 / flax 0.12.8 on this CPU


class Unavailable(Exception):
    """A variant that cannot run here (no maintained path, no GPU): skipped, with the reason."""


def load_model(config: RunConfig, arch: Any, weights: str | None) -> Model:
    """The fp32 model: its module and variables (torch_impl.inference.load_model's mirror; Flax keeps them apart)."""
    return make_train_model(config.replace(init_weights=weights, precision="fp32", remat="none"), arch)


def _conv_of(norm_name: str) -> str:
    return norm_name.replace("bn", "conv")  # bn1 -> conv1, downsample_bn -> downsample_conv


def fold_batchnorm(model: Model) -> Model:
    """The folded model (torch_impl/inference.py's twin): the module with its BatchNorms reduced to biases
    (ResNet(folded_norm=True)) and its folded parameters (``_fold``). Raises Unavailable without BatchNorm."""
    module, variables = model
    if not variables.get("batch_stats"):
        raise Unavailable("the model has no BatchNorm statistics to fold")
    return module.clone(folded_norm=True), {"params": _fold(variables["params"], variables["batch_stats"])}


def _fold(params: Mapping[str, Any], stats: Mapping[str, Any]) -> dict[str, Any]:
    """Params of the folded model: each conv kernel scaled by gamma/sqrt(var+eps) per output channel, each
    BatchNorm reduced to the bias beta - mean * gamma/sqrt(var+eps). In float64, then float32, so the folding adds
    no rounding of its own."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and "scale" in value and name in stats:  # a BatchNorm
            continue
        out[name] = _fold(value, stats.get(name, {})) if isinstance(value, Mapping) and name != "fc" else value
    for name, value in params.items():
        if isinstance(value, Mapping) and "scale" in value and name in stats:
            gamma, beta = np.asarray(value["scale"], np.float64), np.asarray(value["bias"], np.float64)
            mean, var = np.asarray(stats[name]["mean"], np.float64), np.asarray(stats[name]["var"], np.float64)
            factor = gamma / np.sqrt(var + BN_EPS)
            conv = _conv_of(name)
            out[conv] = {"kernel": (np.asarray(params[conv]["kernel"], np.float64) * factor).astype(np.float32)}
            out[name] = {"bias": (beta - mean * factor).astype(np.float32)}
    return out


def quantize_int8(model: Model) -> Model:
    """Weight-only INT8 (common/inference.py's "int8"): the module and its variables with every conv/dense kernel
    as int8 with one fp32 scale per output channel (``int8_per_channel``, the integers torch's twin holds), the rest
    unchanged. The module takes them through ``_dequantize`` (torch's twin dequantizes in a forward pre-hook)."""
    module, variables = model
    return module, {**variables, "params": _quantize_params(variables["params"])}


def _quantize_params(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping):
            out[name] = _quantize_params(value)
        elif name == "kernel":
            q, scale = int8_per_channel(np.asarray(value), channel_axis=-1)
            out[name] = {"int8": q, "scale": scale.reshape(dequantize_shape(q.ndim, -1))}
        else:
            out[name] = value
    return out


def _dequantize(params: Mapping[str, Any], dtype: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and set(value) == {"int8", "scale"}:
            out[name] = value["int8"].astype(dtype) * value["scale"].astype(dtype)
        elif isinstance(value, Mapping):
            out[name] = _dequantize(value, dtype)
        else:
            out[name] = value
    return out


def _host(fn: Callable[[jax.Array], jax.Array]) -> Predict:
    def predict(images: np.ndarray) -> np.ndarray:
        return np.asarray(fn(jax.device_put(images)), np.float32)  # the copy out waits for the device

    predict.jitted = fn  # type: ignore[attr-defined]  # compile_counts reads its cache
    return predict


def compile_counts(predict: Predict) -> dict[str, int]:
    """The fields torch's compile_counts reports, for the caller to difference around a warm-up: "graphs", the
    programs the variant's jitted function holds (one per input shape seen; 0 for the un-jitted call), and
    "recompile-limit hits" (jax.jit has no recompile limit: always 0)."""
    size = getattr(getattr(predict, "jitted", None), "_cache_size", None)
    return {"graphs": int(size()) if callable(size) else 0, "recompile-limit hits": 0}


def _example(config: RunConfig, arch: Any) -> jax.Array:
    return jnp.asarray(arch.example(1, config.image_size))


def _inference_model(config: RunConfig, arch: Any, dtype: str) -> Module:
    """The family's module (jax_impl/train.py's ``build``) in ``dtype`` without remat."""
    return build_model(config.replace(precision=dtype, remat="none"), arch)


def _int8(model: Model, device: Any) -> tuple[Predict, str]:
    """Weight-only INT8: the kernels dequantized inside the jitted fp32 forward (BatchNorm statistics kept)."""
    module, variables = quantize_int8(model)
    quantized = jax.device_put(variables["params"])
    rest = {name: value for name, value in variables.items() if name != "params"}

    def int8_forward(images: jax.Array) -> jax.Array:
        return module.apply({**rest, "params": _dequantize(quantized, jnp.float32)}, images, train=False)

    return _host(jax.jit(int8_forward)), f"int8 kernels dequantized inside the jitted forward, on {device}"


def _int8_dynamic(config: RunConfig, arch: Any, variables: Mapping[str, Any], device: Any) -> tuple[Predict, str]:
    """qwix PTQ of the dense layers' dots: int8 weights per output channel, each call's activations quantized to
    int8 with one scale per tensor (``act_batch_axes=()``: torch's quantize_dynamic scales a whole tensor too), the
    dot in int8 with int32 accumulation. Raises Unavailable without qwix."""
    qwix = _qwix()
    model = _inference_model(config, arch, "fp32")
    rule = qwix.QtRule(module_path=".*", op_names=("dot_general",), weight_qtype=jnp.int8, act_qtype=jnp.int8,
                       act_batch_axes=())
    return _ptq(qwix, model, rule, config, arch, variables), (
        f"qwix {qwix.__version__} PTQ of the dense dots (symmetric int8 activations), jax.jit, on {device}")


def _qwix() -> Any:
    try:
        import qwix
    except ImportError as exc:
        raise Unavailable(f"qwix is not installed ({exc}); {QWIX_PIP}") from None
    return qwix


def _ptq(qwix: Any, model: Module, rule: Any, config: RunConfig, arch: Any, variables: Mapping[str, Any]) -> Predict:
    """``model`` with qwix's post-training ``rule`` (the model's dots intercepted, no change to the model), its
    weights quantized once, jitted."""
    ptq = qwix.quantize_model(model, qwix.PtqProvider([rule]))
    abstract = jax.eval_shape(ptq.init, jax.random.key(0), _example(config, arch))
    params = qwix.quantize_params(jax.tree.map(jnp.asarray, variables["params"]), abstract["params"])
    rest = {name: value for name, value in variables.items() if name != "params"}

    def ptq_forward(inputs: jax.Array) -> jax.Array:
        return ptq.apply({**rest, "params": params}, inputs, train=False)

    return _host(jax.jit(ptq_forward))


def _int4(config: RunConfig, arch: Any, variables: Mapping[str, Any], device: Any) -> tuple[Predict, str]:
    """qwix PTQ: each weight int4 with per-group scales, the activations fp32. Raises Unavailable without qwix."""
    if not arch.int4:
        raise Unavailable(f"INT4 weight-only is measured for the text encoder only ({arch.name}: not here)")
    qwix = _qwix()
    model = _inference_model(config, arch, "fp32")
    rule = qwix.QtRule(module_path=".*", weight_qtype=jnp.int4, tile_size=INT4_GROUP)
    return _ptq(qwix, model, rule, config, arch, variables), (
        f"qwix {qwix.__version__} INT4 weight-only PTQ of every dense kernel (symmetric, group {INT4_GROUP}; int4 "
        f"values and their scales taken into the jitted dots by qwix's dot_general), fp32 activations, on {device}")


def build(name: str, config: RunConfig, arch: Any, weights: str | None,
          calibration: list[np.ndarray]) -> tuple[Predict, str]:
    """(predict, what this variant is here) for one of VARIANTS; raises Unavailable to skip it."""
    model = load_model(config, arch, weights)
    module, variables = model
    device = jax.devices()[0]

    def forward(images: jax.Array) -> jax.Array:
        return module.apply(variables, images, train=False)

    if name == "eager":
        # The un-jitted call, as in training's eager step (jax_impl/train.py) and as a JAX user meets it: each
        # operation dispatched on its own, JAX's and Flax's own jitted helpers kept whole (not jax.disable_jit)
        return _host(forward), f"un-jitted call (op by op) fp32 on {device}"
    if name == "compiled":
        per_shape = ": one program per padded length" if arch.inputs == "tokens" else ""
        return _host(jax.jit(forward)), f"jax.jit fp32 on {device}{per_shape}"
    if name == "folded":
        folded, folded_variables = fold_batchnorm(model)
        params = jax.device_put(folded_variables["params"])
        return _host(jax.jit(lambda images: folded.apply({"params": params}, images))), \
            f"conv+BN folded into the conv weights, jax.jit fp32 on {device}"
    if name == "int8":
        return _int8(model, device)
    if name == "int8-dynamic":
        return _int8_dynamic(config, arch, variables, device)
    if name == "int8-static":
        raise Unavailable("no static (calibrated-activation) INT8 path in JAX's libraries: XLA on a CPU has no "
                          "quantized-activation kernels to run it (torch's comes from torch.ao's x86 backend)")
    if name == "int4":
        return _int4(config, arch, variables, device)
    if name == "onnxruntime":
        raise Unavailable("no maintained JAX -> ONNX exporter without TensorFlow (jax2tf + tf2onnx); "
                          "JAX's own deployment path is jax.export (StableHLO)")
    if name == "tensorrt":
        raise Unavailable("no TensorRT path from JAX (TensorRT consumes ONNX or torch programs)")
    raise ValueError(f"unknown inference variant '{name}'; known: {', '.join(VARIANTS)}")
