"""The text-classification encoder described once; torch_impl/text.py and jax_impl/text.py both build from it.

A BERT-like pre-LN encoder made of the Vision Transformer's blocks (torch_impl/transformer.py,
jax_impl/transformer.py, unchanged but for an optional key-padding mask): a token embedding, learned position
embeddings, ``depth`` blocks, a final LayerNorm, pooling (the class token at position 0, or the mean of the real
tokens) and a linear head.

The model's input contract (the byte-level tokenizer in common/data/text.py writes it): integer tokens of shape
(batch, length), ``length <= max_len``; ``PAD_ID`` marks padding, anywhere in a row; position 0 holds the class
token, so every row has at least one real token (an all-padding row would leave its softmax and its mean with
nothing to average: the model does not check this, it costs a device sync per step in torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from common.arch_vit import NORM_EPS, check_encoder
from common.errors import ConfigError

PAD_ID = 0  # padding: the attention mask is ``tokens != PAD_ID``
CLS_ID = 1  # the class token at position 0
VOCAB_SIZE = 258  # bytes b -> b + 2 after PAD and CLS

# name -> (width, depth, heads)
TEXT_FAMILY: dict[str, tuple[int, int, int]] = {
    "text-micro": (64, 2, 2),  # tests and smoke runs
    "text-tiny": (128, 4, 4),  # sized for a CPU
    "text-base": (768, 12, 12),  # BERT-base's encoder, sized for a GPU
}


class BlockArch(Protocol):
    """What a transformer Block, Attention and Mlp read from their description: TransformerArch and TextArch
    both provide it, so one block implementation serves the ViT and the text encoder."""

    @property
    def width(self) -> int: ...

    @property
    def depth(self) -> int: ...

    @property
    def heads(self) -> int: ...

    @property
    def mlp_ratio(self) -> float: ...

    @property
    def norm_eps(self) -> float: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def hidden(self) -> int: ...


@dataclass(frozen=True)
class TextArch:
    name: str
    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    vocab_size: int = VOCAB_SIZE
    max_len: int = 256
    pool: str = "cls"
    num_classes: int = 4
    norm_eps: float = NORM_EPS

    family = "text"

    def __post_init__(self) -> None:
        check_encoder(self.pool, self.width, self.heads, self.num_classes)
        if self.max_len < 1:
            raise ConfigError(f"max_len must be at least 1, got {self.max_len}")
        if self.vocab_size <= PAD_ID:
            raise ConfigError(f"vocab_size {self.vocab_size} has no room for the PAD token {PAD_ID}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        """The MLP's inner width."""
        return int(self.width * self.mlp_ratio)


def check_tokens_shape(shape: tuple[int, ...], arch: TextArch) -> None:
    """A clear error for input the model cannot take (shapes are static: this runs under jit too)."""
    if len(shape) != 2:
        raise ConfigError(f"{arch.name} takes tokens of shape (batch, length), got shape {tuple(shape)}")
    if not 1 <= shape[1] <= arch.max_len:
        raise ConfigError(f"{arch.name} takes sequences of at most max_len={arch.max_len} tokens (its position "
                          f"embeddings), got {shape[1]}: truncate them, or build the model with a larger max_len")


def text(name: str, num_classes: int = 4, max_len: int = 256, pool: str = "cls") -> TextArch:
    if name not in TEXT_FAMILY:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(TEXT_FAMILY)}")
    width, depth, heads = TEXT_FAMILY[name]
    return TextArch(name, width, depth, heads, max_len=max_len, pool=pool, num_classes=num_classes)
