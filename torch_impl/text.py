"""The text-classification encoder built from ``common.arch_text`` out of torch_impl/transformer.py's blocks;
jax_impl/text.py is its Flax twin, name for name, so weights transfer one-to-one (common/weights.py).

Padding is exact: the key-padding mask ``tokens != PAD_ID`` gives padded keys no attention weight and the mean pool
averages the real tokens only, so the logits of a sequence do not depend on how much padding follows it, and padded
positions receive no gradient. Precision as the ViT: the token and position embeddings and the residual stream are
fp32 (an embedding is not on autocast's lists), LayerNorm statistics and the softmax fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from common.arch_text import PAD_ID, TextArch, check_tokens_shape
from common.arch_vit import RematPlan
from torch_impl.transformer import Block, EncoderStack, LayerNorm, init_weights

NO_REMAT = RematPlan()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real tokens of (batch, tokens, width): padded tokens are multiplied by 0, so they add
    nothing and receive a gradient of exactly 0."""
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(dim=1) / weights.sum(dim=1)


class TextEncoder(EncoderStack):
    def __init__(self, arch: TextArch) -> None:
        super().__init__()
        self.arch = arch
        self.token_embed = nn.Embedding(arch.vocab_size, arch.width)  # no padding_idx: Flax's nn.Embed has none
        self.pos_embed = nn.Parameter(torch.zeros(1, arch.max_len, arch.width))
        self.blocks = nn.ModuleList(Block(arch) for _ in range(arch.depth))
        self.norm = LayerNorm(arch.width, eps=arch.norm_eps)
        self.head = nn.Linear(arch.width, arch.num_classes)
        init_weights(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """int tokens (batch, length), length <= max_len -> logits (batch, num_classes)."""
        check_tokens_shape(tuple(tokens.shape), self.arch)
        mask = tokens != PAD_ID
        x = self.token_embed(tokens) + self.pos_embed[:, :tokens.shape[1]]  # fp32 from here on: the residual stream
        x = self.norm(self.run_blocks(x, mask))
        pooled = x[:, 0] if self.arch.pool == "cls" else masked_mean(x, mask)
        return self.head(pooled)


def make_model(arch: TextArch, attention: str = "fused", remat: RematPlan = NO_REMAT) -> TextEncoder:
    model = TextEncoder(arch)
    model.set_attention(attention)
    model.set_remat(remat)
    return model
