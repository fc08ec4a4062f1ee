"""The transformer encoder (the ViT on images, the text encoder on tokens) built from ``common.arch_encoder``, with
timm's module names; jax_impl/transformer.py is its Flax twin, name for name, so weights transfer one-to-one
(common/weights.py).

Precision (the article's rules, written out rather than left to autocast's op lists): LayerNorm statistics and the
attention softmax are computed in fp32 whatever the compute dtype; the residual stream stays fp32 (a lower-precision
branch output added to it is promoted); Linear layers and the attention products run in the autocast dtype.

Attention takes an optional key-padding mask (bool (batch, tokens), True = a real token; token inputs have one):
padded keys get no attention weight, exactly (exp of the most negative finite score is 0), and padded positions
receive no gradient. ``None`` keeps the ViT's unmasked path. The token and position embeddings and the residual
stream are fp32 (an embedding is not on autocast's lists).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from common.arch_encoder import PAD_ID, EncoderArch, RematPlan
from common.model_options import DEFAULT_OPTIONS, ModelOptions

INIT_STD = 0.02  # timm's ViT: truncated normal at +-2 std for Linear weights, patch embedding and position embedding


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, written out: the scores tensor (batch, heads, tokens, tokens) is materialised,
    and the softmax runs in fp32 (in fp16 large scores overflow: tests/test_transformer.py shows it). ``mask``:
    bool (batch, tokens), True = a real key."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    # fp32 at least: fp64 stays fp64 (the fp64 parity checks need every step in fp64)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is not None:
        # the most negative finite value, not -inf: exp of it is exactly 0 all the same, and a row with no real key
        # would give a uniform softmax rather than NaN; set in the softmax dtype, where it is representable
        scores = scores.masked_fill(~key_mask(mask), torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1).to(v.dtype)
    return weights @ v


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """(batch, tokens) -> (batch, 1, 1, tokens): the same keys for every head and query."""
    return mask[:, None, None, :]


def fused_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """The backend F.scaled_dot_product_attention picks for these inputs (flash, memory-efficient, cuDNN or the
    math fallback): what actually ran, for the run's notes. Pass the model's padding ``mask`` (bool (batch, tokens))
    when it has one: not every backend takes a mask, so the choice may differ with it."""
    from torch.nn.attention import SDPBackend

    attn_mask = None if mask is None else key_mask(mask)
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask=attn_mask)).name.lower()
    except Exception as exc:  # a private helper: if it moves, say so rather than guess
        return f"unknown ({type(exc).__name__})"


def init_weights(model: nn.Module) -> None:
    """timm's ViT init: every weight (embeddings included) from a normal of std
    INIT_STD truncated at +-2 std, biases 0, LayerNorm scales 1."""
    for name, param in model.named_parameters():
        if name.endswith("bias") or ".norm" in f".{name}":
            continue  # biases 0, LayerNorm scale 1 (torch's defaults for those are zeros / ones already)
        nn.init.trunc_normal_(param, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)) and module.bias is not None:
            nn.init.zeros_(module.bias)


class LayerNorm(nn.LayerNorm):
    """Statistics in fp32 whatever the input dtype (under autocast too); the output is fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.to(self.weight.dtype), self.normalized_shape, self.weight, self.bias, self.eps)


class Attention(nn.Module):
    def __init__(self, arch: EncoderArch) -> None:
        super().__init__()
        self.heads = arch.heads
        self.qkv = nn.Linear(arch.width, 3 * arch.width)
        self.proj = nn.Linear(arch.width, arch.width)
        self.kernel = "fused"  # or "naive": set by make_model from the run's --attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask``: bool (batch, tokens), True = a real token; None attends to every token."""
        batch, tokens, width = x.shape
        # (batch, tokens, 3 * width) read as (3, heads, head_dim): q, k, v of shape (batch, heads, tokens, head_dim)
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        if self.kernel == "fused":
            # a bool attn_mask: True takes part in attention, as ours
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else key_mask(mask))
        else:
            out = naive_attention(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Mlp(nn.Module):
    def __init__(self, arch: EncoderArch) -> None:
        super().__init__()
        self.fc1 = nn.Linear(arch.width, arch.hidden)
        self.fc2 = nn.Linear(arch.hidden, arch.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="none"))  # exact (erf) GELU, as jax_impl sets explicitly


class Block(nn.Module):
    def __init__(self, arch: EncoderArch) -> None:
        super().__init__()
        self.norm1 = LayerNorm(arch.width, eps=arch.norm_eps)
        self.attn = Attention(arch)
        self.norm2 = LayerNorm(arch.width, eps=arch.norm_eps)
        self.mlp = Mlp(arch)
        self.remat_attention = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x)
        if self.remat_attention and self.training:
            x = x + checkpoint(self.attn, h, mask, use_reentrant=False)
        else:
            x = x + self.attn(h, mask)
        return x + self.mlp(self.norm2(x))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real tokens of (batch, tokens, width): padded tokens are multiplied by 0, so they add
    nothing and receive a gradient of exactly 0."""
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(dim=1) / weights.sum(dim=1)


class Encoder(nn.Module):
    """The ViT (``arch.inputs`` images) and the text encoder (tokens): the embedding of its inputs, then the same
    blocks, norm, pooling and head. ``remat_blocks``: the blocks recomputed whole in the backward pass."""

    def __init__(self, arch: EncoderArch) -> None:
        super().__init__()
        self.arch = arch
        if arch.masked:
            self.token_embed = nn.Embedding(arch.vocab_size, arch.width)  # no padding_idx: Flax's nn.Embed has none
        else:
            self.patch_embed = nn.Conv2d(3, arch.width, arch.patch, stride=arch.patch)
            if arch.pool == "cls":
                self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, arch.tokens, arch.width))
        self.blocks = nn.ModuleList(Block(arch) for _ in range(arch.depth))
        self.norm = LayerNorm(arch.width, eps=arch.norm_eps)
        self.head = nn.Linear(arch.width, arch.num_classes)
        self.remat_blocks: frozenset[int] = frozenset()
        init_weights(self)

    def set_remat(self, plan: RematPlan) -> None:
        self.remat_blocks = frozenset(plan.blocks)
        for block in self.blocks:
            block.remat_attention = plan.attention

    def set_attention(self, kernel: str) -> None:
        for block in self.blocks:
            block.attn.kernel = kernel

    def embed(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the residual stream (batch, tokens, width), fp32 from here on; the padding mask, or None)."""
        if self.arch.masked:  # int tokens (batch, length), length <= max_len
            self.arch.check_input(tuple(inputs.shape))
            return self.token_embed(inputs) + self.pos_embed[:, :inputs.shape[1]], inputs != PAD_ID
        x = self.patch_embed(inputs).flatten(2).transpose(1, 2)  # (batch, patches, width), patches row by row
        if self.arch.pool == "cls":
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        return x + self.pos_embed, None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x, mask = self.embed(inputs)
        for index, block in enumerate(self.blocks):
            if index in self.remat_blocks and self.training:
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        x = self.norm(x)
        if self.arch.pool == "cls":
            pooled = x[:, 0]
        else:
            pooled = x.mean(dim=1) if mask is None else masked_mean(x, mask)
        return self.head(pooled)


def make_model(arch: EncoderArch, options: ModelOptions = DEFAULT_OPTIONS) -> Encoder:
    model = Encoder(arch)
    model.set_attention(options.attention)
    model.set_remat(options.remat or RematPlan())
    if options.channels_last and not arch.masked:  # only the patch embedding is a convolution
        model = model.to(memory_format=torch.channels_last)
    return model
