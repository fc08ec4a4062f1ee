"""The text-classification encoder built from ``common.arch_text`` in Flax Linen out of jax_impl/transformer.py's
blocks, module for module and name for name with torch_impl/text.py.

Padding is exact, as in torch_impl: the key-padding mask ``tokens != PAD_ID`` gives padded keys no attention weight
and the mean pool averages the real tokens only. Precision as the ViT: the embeddings and the residual stream are
fp32 at least (the token embedding's output dtype is set so: torch's nn.Embedding is not autocast), LayerNorm
statistics and the softmax fp32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.arch_text import CLS_ID, PAD_ID, TextArch, check_tokens_shape
from common.arch_vit import RematPlan
from jax_impl.transformer import _dense, layer_norm, run_blocks, trunc_init

NO_REMAT = RematPlan()


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over the real tokens of (batch, tokens, width): padded tokens are multiplied by 0, so they add
    nothing and receive a gradient of exactly 0."""
    weights = mask[..., None].astype(x.dtype)
    return (x * weights).sum(axis=1) / weights.sum(axis=1)


class TextEncoder(nn.Module):
    """``remat`` and ``policy`` as jax_impl/transformer.py's VisionTransformer."""

    arch: TextArch
    dtype: Any = jnp.float32
    kernel: str = "fused"
    remat: RematPlan = RematPlan()
    policy: str = "nothing_saveable"

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
        """int tokens (batch, length), length <= max_len -> logits (batch, num_classes)."""
        del train  # no dropout, no batch statistics: train and eval mode compute the same function
        arch = self.arch
        check_tokens_shape(tokens.shape, arch)
        mask = tokens != PAD_ID
        stream = jnp.promote_types(self.dtype, jnp.float32)  # fp32, or fp64 in the fp64 parity checks
        x = nn.Embed(arch.vocab_size, arch.width, dtype=stream, param_dtype=jnp.float32, embedding_init=trunc_init,
                     name="token_embed")(tokens)
        pos = self.param("pos_embed", trunc_init, (1, arch.max_len, arch.width), jnp.float32)
        x = x + pos[:, :tokens.shape[1]]
        x = layer_norm(run_blocks(self, x, mask), arch.norm_eps, "norm")
        pooled = x[:, 0] if arch.pool == "cls" else masked_mean(x, mask)
        return _dense(arch.num_classes, self.dtype, "head")(pooled)


def init_variables(model: TextEncoder, key: jax.Array) -> dict[str, Any]:
    """A batch of one full-length row of class tokens: every position embedding in use, no padding."""
    return model.init(key, jnp.full((1, model.arch.max_len), CLS_ID, jnp.int32), train=False)


def make_model(arch: TextArch, dtype: Any = jnp.float32, attention: str = "fused", remat: RematPlan = NO_REMAT,
               policy: str = "nothing_saveable") -> TextEncoder:
    if not hasattr(jax.checkpoint_policies, policy):
        known = [n for n in dir(jax.checkpoint_policies) if not n.startswith("_")]
        raise ValueError(f"unknown checkpoint policy '{policy}'; known: {', '.join(known)}")
    return TextEncoder(arch, dtype=dtype, kernel=attention, remat=remat, policy=policy)
