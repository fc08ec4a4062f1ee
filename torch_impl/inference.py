"""Inference variants on the torch side; jax_impl/inference.py mirrors them.

Every variant is a callable from a host batch (NHWC float32 images, or int32 tokens (batch, length) padded with 0)
to host logits (numpy), so the caller times what a server sees (copy in, forward, copy out; the copy out
synchronizes) the same way for both sides.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.config import RunConfig
from common.data.text import CLS
from common.inference import VARIANTS, dequantize_shape, int8_per_channel
from torch_impl.compilation import compile_count, compile_options, compiled, recompile_limit_hits
from torch_impl.data import default_device, synchronize, to_nchw
from torch_impl.train import make_model

Predict = Callable[[np.ndarray], np.ndarray]


class Unavailable(Exception):
    """A variant that cannot run here (an optional runtime not installed, no GPU): skipped, with the reason."""


# INT4 weight-only: torchao's IntxWeightOnlyConfig, the CPU path of its current releases (0.18: Int4WeightOnlyConfig's
# CPU packing "opaque" was removed after 0.14, and its other packings need CUDA, bf16 or the mslk kernels). Where the
# description says ``int4`` (the text encoder, where it was checked in both frameworks; a ResNet's compute is its
# convolutions, which these weight-only configs do not cover).
INT4_GROUP = 32  # input channels sharing one scale: divides every text encoder's width and MLP width
TORCHAO_PIP = "pip install torchao==0.18.0"  # the version checked against torch 2.14.1 on this CPU


def load_model(config: RunConfig, arch: Any, weights: str | None) -> torch.nn.Module:
    """The fp32 model with ``weights``, in eval mode, on this process's device (torch_impl/train.py's make_model)."""
    return make_model(config.replace(init_weights=weights, precision="fp32"), arch).eval()


def fold_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """Every conv -> BatchNorm pair folded into one conv with a bias (torch.fx's eval-mode fusion pass)."""
    from torch.fx.experimental.optimization import fuse

    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise Unavailable("the model has no BatchNorm to fold")
    return fuse(copy.deepcopy(model).eval())


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Weight-only INT8 (common/inference.py's "int8"): every Conv2d and Linear weight held as int8 with one scale
    per output channel (``int8_per_channel``, the integers JAX's twin holds), dequantized before each call of the
    layer; activations stay fp32. A forward pre-hook, not a library: torchao's weight-only configs cover Linear
    layers only, and a ResNet's compute is its convolutions."""
    model = copy.deepcopy(model).cpu().eval()
    for layer in model.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            q, scale = int8_per_channel(layer.weight.detach().float().numpy(), channel_axis=0)
            del layer.weight  # the fp32 weight is gone: the layer holds its int8 copy only
            layer.register_buffer("weight_int8", torch.from_numpy(q))
            layer.register_buffer("weight_scale", torch.from_numpy(scale).reshape(dequantize_shape(q.ndim, 0)))
            layer.register_forward_pre_hook(_dequantize_weight)
    return model


def _dequantize_weight(layer: torch.nn.Module, inputs: Any) -> None:
    layer.weight = layer.weight_int8.to(torch.float32) * layer.weight_scale


def _quantize_int8_static(model: torch.nn.Module, calibration: list[np.ndarray]) -> torch.nn.Module:
    """Post-training static INT8 (torch.ao FX graph mode, x86 backend: per-channel int8 weights, uint8
    activations with observed ranges; conv+BN+ReLU fused first). torch 2.14 no longer ships
    torch.ao's PT2E entry points (they moved to torchao); FX mode needs no extra dependency. Raises Unavailable
    for a model torch.fx cannot trace (a ViT's fp32 LayerNorm under its autocast guard)."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    model = copy.deepcopy(model).cpu().eval()
    example = (_to_tensor(calibration[0], torch.device("cpu")),)
    try:
        prepared = prepare_fx(model, get_default_qconfig_mapping("x86"), example_inputs=example)
    except Exception as exc:  # torch.fx's own errors have no common type
        raise Unavailable(f"torch.fx cannot trace this model for static INT8 ({type(exc).__name__}: "
                          f"{str(exc)[:160]})") from None
    with torch.inference_mode():
        for images in calibration:
            prepared(_to_tensor(images, torch.device("cpu")))
    return convert_fx(prepared)


def _quantize_int8_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic INT8 of every Linear layer (torch.ao eager mode, x86: int8 weights per output channel; activations
    quantized per call from their observed range, no calibration); the rest stays fp32."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.backends.quantized.engine = "x86"
    model = copy.deepcopy(model).cpu().eval()
    return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def _quantize_int4(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """INT4 weight-only of every Linear layer with torchao (symmetric, one scale per INT4_GROUP input channels; the
    activations stay fp32 and each weight is dequantized in the forward), and torchao's version. Raises Unavailable
    without torchao."""
    try:
        import torchao
        from torchao.quantization import IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerGroup
    except ImportError as exc:
        raise Unavailable(f"torchao is not installed, or too old for IntxWeightOnlyConfig ({exc}); {TORCHAO_PIP}") \
            from None
    model = copy.deepcopy(model).cpu().eval()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(INT4_GROUP)))
    return model, torchao.__version__


def _int4(model: torch.nn.Module, arch: Any) -> tuple[Predict, str]:
    if not arch.int4:
        raise Unavailable(f"INT4 weight-only is measured for the text encoder only ({arch.name}: not here)")
    quantized, version = _quantize_int4(model)
    return _predictor(quantized, torch.device("cpu")), (
        f"torchao {version} INT4 weight-only of the Linear layers (IntxWeightOnlyConfig, symmetric, group "
        f"{INT4_GROUP}; int4 values held in int8 and dequantized per call: no packed int4 CPU kernel), fp32 "
        f"activations, CPU")


def _export_onnx(model: torch.nn.Module, path: Path, image_size: int) -> Path:
    """ONNX with a dynamic batch axis (TorchScript exporter: the dynamo one needs onnxscript)."""
    example = torch.zeros(1, 3, image_size, image_size)
    torch.onnx.export(copy.deepcopy(model).cpu().eval(), (example,), str(path), dynamo=False, input_names=["images"],
                      output_names=["logits"], dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
    return path


def _export_text_onnx(model: torch.nn.Module, path: Path, max_len: int) -> Path:
    """A text encoder as ONNX with dynamic batch and sequence axes over int32 tokens (what the batch maker makes;
    the embedding's Gather takes them as they are). The padding mask (tokens != 0) is computed inside the graph
    from the tokens, as in the model, so the graph takes tokens alone. The traced example is 2 x 16 (< max_len):
    the sequence axis must not be specialised to max_len, and 2 rows keep the batch axis from folding to 1."""
    example = torch.full((2, min(16, max_len)), CLS + 1, dtype=torch.int32)
    example[:, 0] = CLS
    with warnings.catch_warnings():
        # the model's shape check (EncoderArch.check_input) is Python on traced sizes: evaluated once, as intended
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(copy.deepcopy(model).cpu().eval(), (example,), str(path), dynamo=False,
                          input_names=["tokens"], output_names=["logits"],
                          dynamic_axes={"tokens": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}})
    return path


def _to_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    return to_nchw(np.ascontiguousarray(images)).to(device)


def _predictor(module: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> Predict:
    def predict(images: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = module(_to_tensor(images, device))
        synchronize(device)
        return logits.float().cpu().numpy()

    return predict


def compile_counts(predict: Predict) -> dict[str, int]:
    """Running counts of this process's torch.compile work (graphs compiled, frames that reached the recompile limit
    and run eagerly for new shapes since): the caller takes their difference around a warm-up."""
    return {"graphs": compile_count(), "recompile-limit hits": recompile_limit_hits()}


def _onnxruntime(model: torch.nn.Module, config: RunConfig, arch: Any) -> tuple[Predict, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise Unavailable("onnxruntime is not installed (pip install onnxruntime)") from None
    text = arch.inputs == "tokens"
    # The exported file is needed only until the session has read it: a folder of its own, removed right after.
    with tempfile.TemporaryDirectory(prefix="twinrun-onnx-") as folder:
        path = (_export_text_onnx(model, Path(folder) / "model.onnx", arch.max_len) if text
                else _export_onnx(model, Path(folder) / "model.onnx", config.image_size))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        opset = _opset(path)
    feed = "tokens" if text else "images"

    def predict(batch: np.ndarray) -> np.ndarray:
        return session.run(["logits"], {feed: to_nchw(np.ascontiguousarray(batch)).numpy()})[0]

    axes = "batch and sequence axes, int32 tokens, the padding mask computed in the graph" if text else "batch axis"
    return predict, f"ONNX (opset {opset}, dynamic {axes}) under onnxruntime {ort.__version__}, CPU provider"


def _tensorrt_inputs(config: RunConfig, arch: Any, device: torch.device) -> list[Any]:
    """TensorRT's input specs: one image shape, or int32 tokens with a dynamic batch (1..128) and length."""
    import torch_tensorrt

    if arch.inputs == "tokens":
        return [torch_tensorrt.Input(min_shape=(1, 1), opt_shape=(1, arch.max_len // 2), max_shape=(128, arch.max_len),
                                     dtype=torch.int32)]
    return [torch.zeros(1, 3, config.image_size, config.image_size, device=device)]


def _backend(config: RunConfig) -> str:
    """The compiled variant's backend and mode as its row says them."""
    options = compile_options(config)
    return f"{options['backend']}, mode {options['mode']}" if "mode" in options else options["backend"]


def build(name: str, config: RunConfig, arch: Any, weights: str | None,
          calibration: list[np.ndarray]) -> tuple[Predict, str]:
    """(predict, what this variant is here) for one of VARIANTS; raises Unavailable to skip it."""
    device = default_device()
    model = load_model(config, arch, weights)
    if name == "eager":
        return _predictor(model, device), f"eager fp32 on {device}"
    if name == "compiled" and arch.inputs == "tokens":  # the run's shape handling decides how many graphs it makes
        return _predictor(compiled(config, model), device), (
            f"torch.compile fp32 ({_backend(config)}, dynamic {config.compile_dynamic}) on {device}")
    if name == "compiled":
        return (_predictor(torch.compile(model, **compile_options(config)), device),
                f"torch.compile fp32 ({_backend(config)}) on {device}")
    if name == "folded":
        return _predictor(fold_batchnorm(model), device), f"conv+BN folded (torch.fx fuse), eager fp32 on {device}"
    cpu = torch.device("cpu")
    if name == "int8":
        return _predictor(quantize_int8(model), cpu), "int8 weights dequantized by a forward pre-hook, eager, CPU"
    if name == "int8-dynamic":
        return _predictor(_quantize_int8_dynamic(model), cpu), (
            "torch.ao quantize_dynamic of the Linear layers (x86 kernels; activations per tensor, asymmetric uint8), "
            "eager, CPU")
    if name == "int8-static":
        return _predictor(_quantize_int8_static(model, calibration), cpu), (
            "torch.ao FX static INT8 (x86 kernels: int8 weights per channel, uint8 activations), CPU")
    if name == "int4":
        return _int4(model, arch)
    if name == "onnxruntime":
        return _onnxruntime(model, config, arch)
    if name == "tensorrt":
        if device.type != "cuda":
            raise Unavailable("TensorRT needs a CUDA GPU; none here")
        try:
            import torch_tensorrt
        except ImportError:
            raise Unavailable("torch_tensorrt is not installed (pip install torch-tensorrt)") from None
        trt = torch_tensorrt.compile(model, ir="dynamo", inputs=_tensorrt_inputs(config, arch, device),
                                     enabled_precisions={torch.float32})
        return _predictor(trt, device), f"TensorRT {torch_tensorrt.__version__} fp32"
    raise ValueError(f"unknown inference variant '{name}'; known: {', '.join(VARIANTS)}")


def _opset(path: Path) -> int:
    import onnx

    return int(onnx.load(str(path)).opset_import[0].version)
