"""Analytic forward FLOPs of a model description (a ResNet or a Vision Transformer): the floor that measured step
times are held against.

Counts 2 FLOPs per multiply-accumulate (the convention of torch's FlopCounterMode and XLA's cost analysis) in the
products only. ResNet: convolutions and the classifier; normalisation, activations and pooling are a few per cent of
its work and are not counted. Vision Transformer: the patch embedding, per block the qkv projection, the attention
scores q k^T and the attention-weighted sum of v (both grow with the square of the token count), the output
projection and the two MLP layers, and the head; LayerNorm, softmax, GELU and the residual adds are not counted.
A training step costs about 3x the forward pass (forward, and a backward pass with two products of the same size per
layer).
"""

from __future__ import annotations

from dataclasses import replace

from common.arch import ResNetArch, conv_output_size, stem_output_size
from common.arch_encoder import EncoderArch

TRAIN_STEP_FACTOR = 3.0


def taps_per_axis(size: int, kernel: int, stride: int, padding: int, count_padding: bool) -> int:
    """(output position, kernel tap) pairs along one axis; without ``count_padding`` only taps that land
    inside the input (XLA's cost analysis skips products with the zero padding, torch's counter does not)."""
    out_size = conv_output_size(size, kernel, stride, padding)
    if count_padding:
        return out_size * kernel
    return sum(1 for o in range(out_size) for t in range(kernel) if 0 <= o * stride - padding + t < size)


def conv_flops(in_channels: int, out_channels: int, size: int, kernel: int, stride: int,
               count_padding: bool = True) -> int:
    padding = kernel // 2
    return 2 * in_channels * out_channels * taps_per_axis(size, kernel, stride, padding, count_padding) ** 2


class NoFlopCount(ValueError):
    """A family this module has no analytic count for (a workload from outside the repository): "not measured"."""


def forward_flops(arch: ResNetArch | EncoderArch, image_size: int = 32, batch_size: int = 1,
                  count_padding: bool = True) -> int:
    """Forward FLOPs for ``batch_size`` images of image_size x image_size, of either family (``count_padding``
    concerns the ResNet's padded convolutions only: the ViT's patch embedding has no padding)."""
    if arch.family == "vit":
        return transformer_flops(replace(arch, image_size=image_size)) * batch_size
    if arch.family == "resnet":
        return resnet_flops(arch, image_size, count_padding) * batch_size
    raise NoFlopCount(f"no FLOP count for the model family '{arch.family}'")


def resnet_flops(arch: ResNetArch, image_size: int, count_padding: bool = True) -> int:
    """Forward FLOPs of one image."""
    pad = count_padding
    total = 0
    if arch.stem == "cifar":
        total += conv_flops(3, arch.stem_channels, image_size, 3, 1, pad)
    else:
        total += conv_flops(3, arch.stem_channels, image_size, 7, 2, pad)
    size = stem_output_size(arch.stem, image_size)
    for block in arch.blocks:
        out_size = conv_output_size(size, 3, block.stride, 1)
        if arch.block == "basic":
            total += conv_flops(block.in_channels, block.planes, size, 3, block.stride, pad)
            total += conv_flops(block.planes, block.out_channels, out_size, 3, 1, pad)
        else:
            total += conv_flops(block.in_channels, block.planes, size, 1, 1, pad)
            total += conv_flops(block.planes, block.planes, size, 3, block.stride, pad)
            total += conv_flops(block.planes, block.out_channels, out_size, 1, 1, pad)
        if block.has_downsample:
            total += conv_flops(block.in_channels, block.out_channels, size, 1, block.stride, pad)
        size = out_size
    return total + 2 * arch.feature_channels * arch.num_classes


def attention_flops(arch: EncoderArch) -> int:
    """The products of attention itself in one image, over all blocks: scores q k^T and weights x v, each
    tokens x tokens x width multiply-accumulates (heads x head_dim = width)."""
    return arch.depth * 2 * (2 * arch.tokens * arch.tokens * arch.width)


def transformer_flops(arch: EncoderArch) -> int:
    """Forward FLOPs of one image at ``arch.image_size``: the products of every Linear (and the patch embedding, a
    p x p convolution of stride p: one product per patch), and attention's."""
    width, tokens = arch.width, arch.tokens
    patch_embed = 2 * arch.patches * (3 * arch.patch * arch.patch) * width
    linear_per_token = 3 * width * width + width * width + 2 * width * arch.hidden  # qkv, proj, fc1, fc2
    blocks = arch.depth * 2 * tokens * linear_per_token
    return patch_embed + blocks + attention_flops(arch) + 2 * width * arch.num_classes


def train_step_flops(arch: ResNetArch | EncoderArch, image_size: int = 32, batch_size: int = 1) -> float:
    return TRAIN_STEP_FACTOR * forward_flops(arch, image_size, batch_size)
