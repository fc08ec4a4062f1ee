"""The ResNet family described once; torch_impl/models.py and jax_impl/models.py both build from it.

The description fixes every layer's channels, stride and name (torchvision's names: ``conv1``,
``layer2.0.downsample.0``, ``fc``), so the two implementations, the weight transfer and the FLOP count
all read the same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.errors import ConfigError

# name -> (block kind, blocks per stage). resnet10: one basic block a stage (torchvision's ResNet class and names
# with layers [1, 1, 1, 1]): the tiny preset's and the suite's model, ~30% less for XLA to compile than ResNet-18's
# eight blocks (a JAX fp64 run of 20 steps, 24.2 -> 16.9 s here)
FAMILY: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet10": ("basic", (1, 1, 1, 1)),
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
}
STEMS = ("cifar", "imagenet")
NORMS = ("batch", "group")
BASE_WIDTHS = (64, 128, 256, 512)
EXPANSION = {"basic": 1, "bottleneck": 4}


@dataclass(frozen=True)
class BlockSpec:
    """One residual block: where it sits, what it maps, whether its shortcut needs a projection."""

    stage: int  # 1-based, as torchvision's layer1..layer4
    index: int
    in_channels: int
    planes: int
    out_channels: int
    stride: int

    @property
    def has_downsample(self) -> bool:
        return self.stride != 1 or self.in_channels != self.out_channels

    @property
    def flax_name(self) -> str:
        return f"layer{self.stage}_{self.index}"


@dataclass(frozen=True)
class ResNetArch:
    name: str
    block: str
    depths: tuple[int, ...]
    stem: str = "cifar"
    width: float = 1.0
    num_classes: int = 100
    zero_init_residual: bool = False
    norm: str = "batch"
    blocks: tuple[BlockSpec, ...] = field(init=False, repr=False)

    family = "resnet"  # the key each framework's registry builds by (torch_impl/models.py, jax_impl/models.py)
    # What differs by family, read by the frameworks instead of the family's name:
    inputs = "images"  # NHWC float images ("tokens": int token ids with a padding mask)
    attention = False  # whether --attention chooses a kernel in it
    int4 = False  # INT4 weight-only is measured on the text encoder only

    def example(self, batch: int, image_size: int) -> np.ndarray:
        """An input of the model's kind (only its shape and dtype matter): what a builder initialises from."""
        return np.zeros((batch, image_size, image_size, 3), np.float32)

    def __post_init__(self) -> None:
        if self.stem not in STEMS:
            raise ConfigError(f"unknown stem '{self.stem}'; known: {', '.join(STEMS)}")
        if self.norm not in NORMS:
            raise ConfigError(f"unknown norm '{self.norm}'; known: {', '.join(NORMS)}")
        if not 0 < self.width <= 8:
            raise ConfigError(f"width multiplier must be in (0, 8], got {self.width}")
        if self.num_classes <= 1:
            raise ConfigError(f"num_classes must be at least 2, got {self.num_classes}")
        blocks = []
        in_channels = self.stem_channels
        for stage, (depth, planes) in enumerate(zip(self.depths, self.stage_planes, strict=True), start=1):
            for index in range(depth):
                stride = 2 if stage > 1 and index == 0 else 1
                out_channels = planes * EXPANSION[self.block]
                blocks.append(BlockSpec(stage, index, in_channels, planes, out_channels, stride))
                in_channels = out_channels
        object.__setattr__(self, "blocks", tuple(blocks))

    @property
    def stem_channels(self) -> int:
        return scaled(64, self.width)

    @property
    def stage_planes(self) -> tuple[int, ...]:
        return tuple(scaled(w, self.width) for w in BASE_WIDTHS)

    @property
    def feature_channels(self) -> int:
        return self.blocks[-1].out_channels


def scaled(channels: int, width: float) -> int:
    """Channels under a width multiplier; at least 4, so GroupNorm and tiny CPU presets stay valid."""
    return max(4, int(round(channels * width)))


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def stem_output_size(stem: str, image_size: int) -> int:
    if stem == "cifar":
        return image_size
    return conv_output_size(conv_output_size(image_size, 7, 2, 3), 3, 2, 1)


def group_count(channels: int) -> int:
    """GroupNorm groups: 32 where it divides the channels (the usual choice), else the largest divisor <= 32."""
    return max(g for g in range(1, 33) if channels % g == 0)


def parse_remat_stages(text: str) -> tuple[int, ...]:
    """The stages (1..4) whose activations are recomputed in the backward pass: ``none``, ``all`` or stage numbers
    like ``2,3`` (the transformer's counterpart is common/arch_encoder.py's ``parse_remat``)."""
    plain = text.strip().lower()
    if plain in ("none", ""):
        return ()
    if plain == "all":
        return (1, 2, 3, 4)
    try:
        stages = tuple(sorted({int(s) for s in plain.replace("stages:", "").split(",")}))
    except ValueError:
        raise ConfigError(f"grad_checkpointing (remat) must be none, all or stage numbers like '2,3'; "
                          f"got '{text}'") from None
    if not stages or min(stages) < 1 or max(stages) > 4:
        raise ConfigError(f"grad_checkpointing (remat) stages must be within 1..4, got '{text}'")
    return stages


def resnet(name: str, stem: str = "cifar", width: float = 1.0, num_classes: int = 100,
           zero_init_residual: bool = False, norm: str = "batch") -> ResNetArch:
    if name not in FAMILY:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(FAMILY)}")
    block, depths = FAMILY[name]
    return ResNetArch(name, block, depths, stem, width, num_classes, zero_init_residual, norm)
