"""The Vision Transformer family described once; torch_impl/transformer.py and jax_impl/transformer.py both build
from it, and the weight transfer (common/weights.py) and the FLOP count (experiments/reporting/flops.py) read it.

A pre-LN encoder (timm's layout and names): patch embedding (a p x p convolution of stride p), an optional class
token, learned position embeddings, ``depth`` blocks of ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``, a final
LayerNorm, pooling (the class token, or the mean of all tokens) and a linear head. q, k and v come from one packed
``qkv`` Linear whose output is read as (3, heads, head_dim), the same layout on both sides, so the transfer is a
transpose. Both sides use exact (erf) GELU and LayerNorm epsilon ``norm_eps`` (flax's defaults, the tanh GELU and
1e-6, and torch's, erf and 1e-5, differ: here both are set explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError

# name -> (width, depth, heads); patch 4 on 32 x 32 images: 64 tokens (+ the class token)
VIT_FAMILY: dict[str, tuple[int, int, int]] = {
    "vit-micro": (64, 2, 2),  # tests and smoke runs
    "vit-tiny": (192, 6, 3),  # sized for a CPU
    "vit-s": (384, 12, 6),  # sized for a GPU
}
POOLS = ("cls", "mean")
ATTENTION_KERNELS = ("naive", "fused")
NORM_EPS = 1e-6


def check_encoder(pool: str, width: int, heads: int, num_classes: int) -> None:
    """The checks every encoder description makes (TransformerArch here, TextArch in common/arch_text.py)."""
    if pool not in POOLS:
        raise ConfigError(f"unknown pool '{pool}'; known: {', '.join(POOLS)}")
    if width % heads:
        raise ConfigError(f"width {width} is not divisible by {heads} heads")
    if num_classes <= 1:
        raise ConfigError(f"num_classes must be at least 2, got {num_classes}")


@dataclass(frozen=True)
class TransformerArch:
    name: str
    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    patch: int = 4
    image_size: int = 32
    pool: str = "cls"
    num_classes: int = 100
    norm_eps: float = NORM_EPS

    family = "vit"

    def __post_init__(self) -> None:
        check_encoder(self.pool, self.width, self.heads, self.num_classes)
        if self.image_size % self.patch:
            raise ConfigError(f"image_size {self.image_size} is not a multiple of the patch size {self.patch}: the "
                              f"patches would not tile the image")

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
        """Sequence length: the patches, and the class token when pooling by it."""
        return self.patches + (1 if self.pool == "cls" else 0)


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


def vit(name: str, num_classes: int = 100, image_size: int = 32, pool: str = "cls") -> TransformerArch:
    if name not in VIT_FAMILY:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(VIT_FAMILY)}")
    width, depth, heads = VIT_FAMILY[name]
    return TransformerArch(name, width, depth, heads, image_size=image_size, pool=pool, num_classes=num_classes)
