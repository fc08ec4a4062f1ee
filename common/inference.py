"""What each inference variant computes, written once for both frameworks, and the INT8 quantizer both use.

A variant's name means one computation in both frameworks: its ``method`` (below) is what every inference row of
that variant says, whichever framework ran it; how a framework runs it (eager, torch.compile, jax.jit, a runtime)
is the row's ``note``. A framework that has no path to a variant skips it with the reason, never with another
method under the same name. Weight-only INT8 quantizes with ``int8_per_channel`` on both sides, so the two hold the
same integers and scales for the same weights (the weights are transferred: tests/test_inference_methods.py).
"""

from __future__ import annotations

import numpy as np

INT8_MAX = 127  # symmetric int8: -127..127 (-128 unused, so that -q is always representable)

METHODS: dict[str, str] = {
    "eager": "fp32, each operation dispatched on its own (no compilation)",
    "compiled": "fp32, the forward compiled (torch.compile / jax.jit)",
    "folded": "fp32, each BatchNorm folded into the conv before it (weights scaled, a bias added)",
    "int8": "weight-only int8: every conv and dense kernel int8 with one scale per output channel (symmetric, "
            "max-abs), dequantized in the forward; fp32 activations",
    "int8-dynamic": "dynamic int8 of the dense layers: int8 weights (one scale per output channel) times int8 "
                    "activations quantized at each call from their range, int32 accumulation; every other layer fp32",
    "int8-static": "static int8: int8 weights per channel and int8 activations whose ranges were calibrated on eval "
                   "batches beforehand; conv+BN+ReLU fused",
    "int4": "weight-only int4 of the dense layers (symmetric, one scale per group of 32 input channels), "
            "dequantized in the forward; fp32 activations",
    "onnxruntime": "fp32, the model exported to ONNX and run by onnxruntime",
    "tensorrt": "fp32, the model compiled by TensorRT",
}
VARIANTS: tuple[str, ...] = tuple(METHODS)


def int8_per_channel(weight: np.ndarray, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` as symmetric int8 with one fp32 scale per output channel (``channel_axis``: 0 in torch's layouts,
    -1 in Flax's): scale = max|w| / 127 over the channel's weights, q = round(w / scale) clipped to +-127."""
    w = np.asarray(weight, np.float32)
    axis = channel_axis % w.ndim
    per_channel = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = (np.maximum(np.abs(per_channel).max(axis=1), 1e-12) / INT8_MAX).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_shape(ndim: int, channel_axis: int) -> tuple[int, ...]:
    """The shape a channel's scale broadcasts to against a weight of ``ndim`` axes."""
    shape = [1] * ndim
    shape[channel_axis % ndim] = -1
    return tuple(shape)
