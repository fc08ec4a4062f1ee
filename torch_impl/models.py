"""The family registry (``make_model(arch, options)``, one signature for every family) and the ResNets built from
``common.arch``, with torchvision's module names and initialisation, so a torchvision state_dict loads unchanged and
weights transfer one-to-one to the Flax twin."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from common.arch import BlockSpec, ResNetArch, group_count
from common.model_options import DEFAULT_OPTIONS, ModelOptions
from common.registry import Registry
from torch_impl import transformer

BN_EPS = 1e-5
BN_MOMENTUM = 0.1  # torch convention: weight of the new batch statistic (Flax's 0.9 is the decay)


def norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(group_count(channels), channels, eps=BN_EPS)
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


def conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, spec: BlockSpec, norm: str) -> None:
        super().__init__()
        self.conv1 = conv(spec.in_channels, spec.planes, 3, spec.stride)
        self.bn1 = norm_layer(norm, spec.planes)
        self.conv2 = conv(spec.planes, spec.out_channels, 3)
        self.bn2 = norm_layer(norm, spec.out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(spec, norm)

    def last_norm(self) -> nn.Module:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5: the stride sits on the 3x3 convolution."""

    def __init__(self, spec: BlockSpec, norm: str) -> None:
        super().__init__()
        self.conv1 = conv(spec.in_channels, spec.planes, 1)
        self.bn1 = norm_layer(norm, spec.planes)
        self.conv2 = conv(spec.planes, spec.planes, 3, spec.stride)
        self.bn2 = norm_layer(norm, spec.planes)
        self.conv3 = conv(spec.planes, spec.out_channels, 1)
        self.bn3 = norm_layer(norm, spec.out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(spec, norm)

    def last_norm(self) -> nn.Module:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def _downsample(spec: BlockSpec, norm: str) -> nn.Sequential | None:
    if not spec.has_downsample:
        return None
    return nn.Sequential(conv(spec.in_channels, spec.out_channels, 1, spec.stride), norm_layer(norm, spec.out_channels))


class ResNet(nn.Module):
    def __init__(self, arch: ResNetArch) -> None:
        super().__init__()
        self.arch = arch
        block_cls = BasicBlock if arch.block == "basic" else Bottleneck
        if arch.stem == "cifar":
            self.conv1 = conv(3, arch.stem_channels, 3)
        else:
            self.conv1 = nn.Conv2d(3, arch.stem_channels, 7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(arch.norm, arch.stem_channels)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if arch.stem == "imagenet" else nn.Identity()
        for stage in range(1, len(arch.depths) + 1):
            specs = [b for b in arch.blocks if b.stage == stage]
            setattr(self, f"layer{stage}", nn.Sequential(*(block_cls(s, arch.norm) for s in specs)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(arch.feature_channels, arch.num_classes)
        # Stages whose blocks recompute activations in the backward pass instead of storing them.
        self.checkpoint_stages: frozenset[int] = frozenset()
        self._init_weights()

    def _init_weights(self) -> None:
        """torchvision's scheme: kaiming-normal fan_out convs, unit/zero norm affine, default Linear."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.arch.zero_init_residual:
            for module in self.modules():
                if isinstance(module, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(module.last_norm().weight)

    def stages(self) -> Iterable[tuple[int, nn.Sequential]]:
        return ((s, getattr(self, f"layer{s}")) for s in range(1, len(self.arch.depths) + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage, layer in self.stages():
            for block in layer:
                if stage in self.checkpoint_stages and self.training:
                    x = _checkpointed(block, x)
                else:
                    x = block(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


@contextlib.contextmanager
def _frozen_bn_statistics(module: nn.Module) -> Iterator[None]:
    """Momentum 0 keeps running statistics as they are: the recomputed forward must not update them a
    second time (Flax's remat discards the recomputation's updates by construction)."""
    norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum


def _checkpointed(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        # Under torch.compile, AOTAutograd places the recomputation in the backward graph, where the
        # functionalised BatchNorm updates are not replayed.
        return checkpoint(block, x, use_reentrant=False)
    return checkpoint(block, x, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _frozen_bn_statistics(block)))


def resnet(arch: ResNetArch, options: ModelOptions = DEFAULT_OPTIONS) -> ResNet:
    model = ResNet(arch)
    model.checkpoint_stages = frozenset(options.remat)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


# family -> its builder, all of one signature; a workload from outside the repository adds its own
MODELS = Registry("torch", {"resnet": resnet, "vit": transformer.make_model, "text": transformer.make_model})


def make_model(arch: Any, options: ModelOptions = DEFAULT_OPTIONS) -> nn.Module:
    """The torch model of ``arch``'s family, set up with the run's ``options``."""
    return MODELS.build(arch, options)
