"""Inference variants on the torch side; jax_impl/inference.py mirrors them.

Every variant is a callable from a host NHWC float32 batch to host logits (numpy), so the caller times
what a server sees (copy in, forward, copy out; the copy out synchronizes) the same way for both sides.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.config import INFERENCE_VARIANTS as VARIANTS
from common.config import RunConfig
from torch_impl.data import default_device, synchronize, to_nchw
from torch_impl.train import make_model

Predict = Callable[[np.ndarray], np.ndarray]


class Unavailable(Exception):
    """A variant that cannot run here (an optional runtime not installed, no GPU): skipped, with the reason."""


# How each family is quantized to INT8. FX static quantization traces the model, and torch.fx cannot trace the
# ViT's fp32 LayerNorm (its torch.autocast(x.device.type) guard: "Expected `device_type` of type `str`, got:
# torch.fx.proxy.Attribute"); a transformer's compute is its Linear layers, which dynamic quantization covers
# without tracing.
INT8_METHODS = {"resnet": "static", "vit": "dynamic"}


def load_model(config: RunConfig, arch: Any, weights: str | None, device: torch.device) -> torch.nn.Module:
    return make_model(config.replace(init_weights=weights, precision="fp32"), arch, device).eval()


def fold_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """Every conv -> BatchNorm pair folded into one conv with a bias (torch.fx's eval-mode fusion pass)."""
    from torch.fx.experimental.optimization import fuse

    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise Unavailable("the model has no BatchNorm to fold")
    return fuse(copy.deepcopy(model).eval())


def quantize_int8(model: torch.nn.Module, calibration: list[np.ndarray]) -> torch.nn.Module:
    """Post-training static INT8 (torch.ao FX graph mode, x86 backend: per-channel int8 weights, uint8
    activations with observed ranges; conv+BN+ReLU fused first). torch 2.14 no longer ships
    torch.ao's PT2E entry points (they moved to torchao); FX mode needs no extra dependency."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    model = copy.deepcopy(model).cpu().eval()
    example = (_to_tensor(calibration[0], torch.device("cpu")),)
    prepared = prepare_fx(model, get_default_qconfig_mapping("x86"), example_inputs=example)
    with torch.inference_mode():
        for images in calibration:
            prepared(_to_tensor(images, torch.device("cpu")))
    return convert_fx(prepared)


def quantize_int8_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic INT8 of every Linear layer (torch.ao eager mode, x86: int8 weights per output channel; activations
    quantized per batch from their observed range at run time, no calibration); the rest stays fp32."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.backends.quantized.engine = "x86"
    model = copy.deepcopy(model).cpu().eval()
    return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def _int8(model: torch.nn.Module, arch: Any, calibration: list[np.ndarray]) -> tuple[Predict, str]:
    """The family's INT8 method (INT8_METHODS), on the CPU's quantized kernels, with what it is."""
    cpu = torch.device("cpu")
    if INT8_METHODS.get(arch.family) == "dynamic":
        return _predictor(quantize_int8_dynamic(model), cpu), (
            "torch.ao dynamic INT8 of the Linear layers (int8 weights per channel, activations quantized per batch at "
            "run time; every other layer fp32), CPU kernels: FX static quantization cannot trace this model")
    note = "torch.ao FX static INT8 (x86: int8 weights per channel, uint8 activations), CPU kernels"
    return _predictor(quantize_int8(model, calibration), cpu), note


def export_onnx(model: torch.nn.Module, path: Path, image_size: int) -> Path:
    """ONNX with a dynamic batch axis (TorchScript exporter: the dynamo one needs onnxscript)."""
    example = torch.zeros(1, 3, image_size, image_size)
    torch.onnx.export(copy.deepcopy(model).cpu().eval(), (example,), str(path), dynamo=False, input_names=["images"],
                      output_names=["logits"], dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
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


def build(name: str, config: RunConfig, arch: Any, weights: str | None,
          calibration: list[np.ndarray]) -> tuple[Predict, str]:
    """(predict, what this variant is here) for one of VARIANTS; raises Unavailable to skip it."""
    device = default_device()
    model = load_model(config, arch, weights, device)
    if name == "eager":
        return _predictor(model, device), f"eager fp32 on {device}"
    if name == "compiled":
        return _predictor(torch.compile(model), device), f"torch.compile fp32 on {device}"
    if name == "folded":
        return _predictor(fold_batchnorm(model), device), f"conv+BN folded (torch.fx fuse), eager fp32 on {device}"
    if name == "int8":
        return _int8(model, arch, calibration)
    if name == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            raise Unavailable("onnxruntime is not installed (pip install onnxruntime)") from None
        folder = Path(tempfile.mkdtemp(prefix="twinrun-onnx-"))
        session = ort.InferenceSession(str(export_onnx(model, folder / "model.onnx", config.image_size)),
                                       providers=["CPUExecutionProvider"])

        def predict(images: np.ndarray) -> np.ndarray:
            return session.run(["logits"], {"images": to_nchw(np.ascontiguousarray(images)).numpy()})[0]

        opset = _opset(folder / "model.onnx")
        return predict, f"ONNX (opset {opset}) under onnxruntime {ort.__version__}, CPU provider"
    if name == "tensorrt":
        if device.type != "cuda":
            raise Unavailable("TensorRT needs a CUDA GPU; none here")
        try:
            import torch_tensorrt
        except ImportError:
            raise Unavailable("torch_tensorrt is not installed (pip install torch-tensorrt)") from None
        example = torch.zeros(1, 3, config.image_size, config.image_size, device=device)
        trt = torch_tensorrt.compile(model, ir="dynamo", inputs=[example], enabled_precisions={torch.float32})
        return _predictor(trt, device), f"TensorRT {torch_tensorrt.__version__} fp32"
    raise ValueError(f"unknown inference variant '{name}'; known: {', '.join(VARIANTS)}")


def _opset(path: Path) -> int:
    import onnx

    return int(onnx.load(str(path)).opset_import[0].version)
