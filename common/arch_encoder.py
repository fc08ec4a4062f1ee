"""The transformer encoder described once, for images (the Vision Transformer) and for text; torch_impl/transformer.py
and jax_impl/transformer.py each build both from it, and the weight transfer (common/weights.py) and the FLOP count
(experiments/reporting/flops.py) read it.

A pre-LN encoder (timm's layout and names): an embedding, learned position embeddings, ``depth`` blocks of
``x + attn(norm1(x))``, ``x + mlp(norm2(x))``, a final LayerNorm, pooling (the class token, or the mean of the real
tokens) and a linear head. q, k and v come from one packed ``qkv`` Linear whose output is read as (3, heads,
head_dim), the same layout on both sides, so the transfer is a transpose. Both sides use exact (erf) GELU and
LayerNorm epsilon ``norm_eps`` (flax's defaults, the tanh GELU and 1e-6, and torch's, erf and 1e-5, differ: here both
are set explicitly).

What the encoder takes is ``inputs``:
- ``images``: NHWC images cut into p x p patches (a p x p convolution of stride p), an optional class token prepended.
- ``tokens``: the byte-level tokenizer's int tokens (common/data/text.py), shape (batch, length), ``length <=
  max_len``; ``PAD_ID`` marks padding, anywhere in a row, and the key-padding mask ``tokens != PAD_ID`` gives padded
  keys no attention weight and the mean pool averages the real tokens only; position 0 holds the class token, so
  every row has at least one real token (the model does not check this: it costs a device sync per step in torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.errors import ConfigError

PAD_ID = 0  # padding: the attention mask is ``tokens != PAD_ID``
CLS_ID = 1  # the class token at position 0
VOCAB_SIZE = 258  # bytes b -> b + 2 after PAD and CLS

# name -> (width, depth, heads); patch 4 on 32 x 32 images: 64 tokens (+ the class token)
VIT_FAMILY: dict[str, tuple[int, int, int]] = {
    "vit-micro": (64, 2, 2),  # tests and smoke runs
    "vit-tiny": (192, 6, 3),  # sized for a CPU
    "vit-s": (384, 12, 6),  # sized for a GPU
}
TEXT_FAMILY: dict[str, tuple[int, int, int]] = {
    "text-micro": (64, 2, 2),  # tests and smoke runs
    "text-tiny": (128, 4, 4),  # sized for a CPU
    "text-base": (768, 12, 12),  # BERT-base's encoder, sized for a GPU
}
INPUTS = ("images", "tokens")
POOLS = ("cls", "mean")
ATTENTION_KERNELS = ("naive", "fused")
NORM_EPS = 1e-6


@dataclass(frozen=True)
class EncoderArch:
    name: str
    width: int
    depth: int
    heads: int
    inputs: str = "images"
    mlp_ratio: float = 4.0
    pool: str = "cls"
    num_classes: int = 100
    norm_eps: float = NORM_EPS
    patch: int = 4  # images
    image_size: int = 32  # images
    vocab_size: int = VOCAB_SIZE  # tokens
    max_len: int = 256  # tokens: the most a sequence may hold (its position embeddings)

    # What differs by family, read by the frameworks instead of the family's name (common/arch.py's ResNetArch):
    attention = True

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise ConfigError(f"unknown encoder inputs '{self.inputs}'; known: {', '.join(INPUTS)}")
        if self.pool not in POOLS:
            raise ConfigError(f"unknown pool '{self.pool}'; known: {', '.join(POOLS)}")
        if self.width % self.heads:
            raise ConfigError(f"width {self.width} is not divisible by {self.heads} heads")
        if self.num_classes <= 1:
            raise ConfigError(f"num_classes must be at least 2, got {self.num_classes}")
        if self.masked:
            if self.max_len < 1:
                raise ConfigError(f"max_len must be at least 1, got {self.max_len}")
            if self.vocab_size <= PAD_ID:
                raise ConfigError(f"vocab_size {self.vocab_size} has no room for the PAD token {PAD_ID}")
        elif self.image_size % self.patch:
            raise ConfigError(f"image_size {self.image_size} is not a multiple of the patch size {self.patch}: the "
                              f"patches would not tile the image")

    @property
    def family(self) -> str:
        """The workload's key (common/workloads.py): the ViT on images, the text encoder on tokens."""
        return "text" if self.masked else "vit"

    @property
    def masked(self) -> bool:
        """Token inputs with a key-padding mask (images have no padding)."""
        return self.inputs == "tokens"

    @property
    def int4(self) -> bool:
        """INT4 weight-only is measured on the text encoder, where it was checked in both frameworks."""
        return self.masked

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        """The MLP's inner width."""
        return int(self.width * self.mlp_ratio)

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def tokens(self) -> int:
        """The most tokens a sequence holds (the position embeddings' rows): the patches and the class token when
        pooling by it, or ``max_len``."""
        if self.masked:
            return self.max_len
        return self.patches + (1 if self.pool == "cls" else 0)

    def example(self, batch: int, image_size: int) -> np.ndarray:
        """An input of the model's kind (only its shape and dtype matter): images of the description's size, or
        full-length rows of class tokens (every position embedding in use, no padding)."""
        del image_size  # the description fixes it
        if self.masked:
            return np.full((batch, self.max_len), CLS_ID, np.int32)
        return np.zeros((batch, self.image_size, self.image_size, 3), np.float32)

    def check_input(self, shape: tuple[int, ...]) -> None:
        """A clear error for token input the model cannot take (shapes are static: this runs under jit too)."""
        if not self.masked:
            return
        if len(shape) != 2:
            raise ConfigError(f"{self.name} takes tokens of shape (batch, length), got shape {tuple(shape)}")
        if not 1 <= shape[1] <= self.max_len:
            raise ConfigError(f"{self.name} takes sequences of at most max_len={self.max_len} tokens (its position "
                              f"embeddings), got {shape[1]}: truncate them, or build the model with a larger max_len")


@dataclass(frozen=True)
class RematPlan:
    """Which parts of a transformer recompute their activations in the backward pass: whole blocks (0-based
    indices) and/or the attention sublayer of every other block."""

    blocks: tuple[int, ...] = ()
    attention: bool = False

    def __bool__(self) -> bool:
        return bool(self.blocks) or self.attention


def parse_remat(text: str, depth: int) -> RematPlan:
    """``none``, ``attention`` (the attention of every block: the article's advice, large activations for little
    compute), ``all`` (every block whole), or 1-based block numbers like ``1,2`` (those blocks whole)."""
    text = text.strip().lower()
    if text in ("none", ""):
        return RematPlan()
    if text == "attention":
        return RematPlan(attention=True)
    if text == "all":
        return RematPlan(blocks=tuple(range(depth)))
    try:
        numbers = sorted({int(s) for s in text.replace("blocks:", "").split(",")})
    except ValueError:
        raise ConfigError(f"grad_checkpointing (remat) of a transformer must be none, attention, all or block numbers "
                          f"like '1,2'; got '{text}'") from None
    if not numbers or numbers[0] < 1 or numbers[-1] > depth:
        raise ConfigError(f"grad_checkpointing (remat) blocks must be within 1..{depth}, got '{text}'")
    return RematPlan(blocks=tuple(n - 1 for n in numbers))


def _shape(name: str, family: dict[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    if name not in family:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(family)}")
    return family[name]


def vit(name: str, num_classes: int = 100, image_size: int = 32, pool: str = "cls") -> EncoderArch:
    width, depth, heads = _shape(name, VIT_FAMILY)
    return EncoderArch(name, width, depth, heads, "images", image_size=image_size, pool=pool, num_classes=num_classes)


def text(name: str, num_classes: int = 4, max_len: int = 256, pool: str = "cls") -> EncoderArch:
    width, depth, heads = _shape(name, TEXT_FAMILY)
    return EncoderArch(name, width, depth, heads, "tokens", max_len=max_len, pool=pool, num_classes=num_classes)
