"""The transformer encoder (the ViT on images, the text encoder on tokens) built from ``common.arch_encoder`` in Flax
Linen, module for module and name for name with torch_impl/transformer.py (images NHWC in, (batch, tokens, width)
inside).

Where JAX must say what torch autocast does by itself (the article's mixed-precision rules):
- LayerNorm: input and ``dtype`` fp32 at least, so its statistics are fp32 whatever the compute dtype
  (``layer_norm`` below).
- Attention softmax: the scores are cast to fp32 before ``jax.nn.softmax`` (``naive_attention``);
  ``jax.nn.dot_product_attention`` computes its logits and softmax in fp32 by itself (its XLA implementation).
- The residual stream stays fp32 (position embeddings are fp32, the token embedding's output dtype is set so: torch's
  nn.Embedding is not autocast; a lower-precision branch output is promoted when added), as in torch.
Known traps set explicitly: exact (erf) GELU (``nn.gelu`` defaults to tanh), LayerNorm epsilon from the description.

Attention takes an optional key-padding mask (bool (batch, tokens), True = a real token; token inputs have one), as
torch_impl's: padded keys get no attention weight, exactly, and the mean pool averages the real tokens only. ``None``
keeps the ViT's unmasked path.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.arch_encoder import PAD_ID, EncoderArch, RematPlan
from common.model_options import DEFAULT_OPTIONS, ModelOptions

INIT_STD = 0.02
trunc_init = nn.initializers.truncated_normal(INIT_STD)  # +-2 std, as torch_impl's trunc_normal_(a, b)


def naive_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(d)) v written out on (batch, tokens, heads, head_dim) arrays; softmax in fp32. ``mask``:
    bool (batch, tokens), True = a real key."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
    if mask is not None:
        # as torch_impl: the most negative finite value of the softmax dtype, whose exp is exactly 0
        scores = jnp.where(key_mask(mask), scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def key_mask(mask: jax.Array) -> jax.Array:
    """(batch, tokens) -> (batch, 1, 1, tokens): the same keys for every head and query."""
    return mask[:, None, None, :]


def fused_implementation() -> str:
    """``jax.nn.dot_product_attention``'s implementation here: cuDNN's fused kernel on an NVIDIA GPU, XLA's
    (which its ``implementation=None`` always picks in jax 0.10) elsewhere."""
    return "cudnn" if jax.devices()[0].platform == "gpu" else "xla"


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    if q.dtype == jnp.float64:  # the XLA implementation rounds fp64 scores to fp32 for its softmax
        return naive_attention(q, k, v, mask)
    implementation = fused_implementation()
    if q.dtype == jnp.float16 and implementation != "cudnn":
        # its XLA implementation asks dot_general for precision F16_F16_F32, which XLA:CPU (and TPU) reject when the
        # program is compiled (its try/except sees only tracing): every fp16 run failed here. The same three
        # operations, written out, softmax in fp32.
        return naive_attention(q, k, v, mask)
    if implementation == "cudnn" and q.dtype not in (jnp.float16, jnp.bfloat16):
        implementation = "xla"  # cuDNN's kernel takes half-precision inputs only
    if mask is None:
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
    # True = attend, broadcast against (batch, heads, queries, keys). Broadcast over the queries here: the cuDNN
    # implementation turns the mask into a bias whose query length must equal the queries' (jax 0.10's check_layout)
    batch, tokens = mask.shape
    mask = jnp.broadcast_to(key_mask(mask), (batch, 1, tokens, tokens))
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def layer_norm(x: jax.Array, epsilon: float, name: str) -> jax.Array:
    """torch's LayerNorm (biased variance, affine) with statistics and output in fp32 at least: the input is cast
    up first (the residual stream is fp32 already; this keeps it so whatever a caller passes)."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    # use_fast_variance=False: torch's two-pass variance; Flax's default E[x^2] - E[x]^2 cancels catastrophically
    # in fp32 when a token's mean is large against its spread
    return nn.LayerNorm(epsilon=epsilon, dtype=x.dtype, param_dtype=jnp.float32, use_fast_variance=False,
                        name=name)(x)


class Attention(nn.Module):
    arch: EncoderArch
    kernel: str = "fused"
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """``mask``: bool (batch, tokens), True = a real token; None attends to every token."""
        arch = self.arch
        batch, tokens, width = x.shape
        qkv = _dense(3 * width, self.dtype, "qkv")(x).reshape(batch, tokens, 3, arch.heads, arch.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (batch, tokens, heads, head_dim) each
        out = fused_attention(q, k, v, mask) if self.kernel == "fused" else naive_attention(q, k, v, mask)
        return _dense(width, self.dtype, "proj")(out.reshape(batch, tokens, width))


class Mlp(nn.Module):
    arch: EncoderArch
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = nn.gelu(_dense(self.arch.hidden, self.dtype, "fc1")(x), approximate=False)
        return _dense(self.arch.width, self.dtype, "fc2")(hidden)


class Block(nn.Module):
    arch: EncoderArch
    kernel: str = "fused"
    dtype: Any = jnp.float32
    remat_attention: bool = False
    policy: str = "nothing_saveable"

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        attention = Attention
        if self.remat_attention:
            attention = nn.remat(Attention, policy=getattr(jax.checkpoint_policies, self.policy))
        eps = self.arch.norm_eps
        x = x + attention(self.arch, self.kernel, self.dtype, name="attn")(layer_norm(x, eps, "norm1"), mask)
        return x + Mlp(self.arch, self.dtype, name="mlp")(layer_norm(x, eps, "norm2"))


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over the real tokens of (batch, tokens, width): padded tokens are multiplied by 0, so they add
    nothing and receive a gradient of exactly 0."""
    weights = mask[..., None].astype(x.dtype)
    return (x * weights).sum(axis=1) / weights.sum(axis=1)


class Encoder(nn.Module):
    """The ViT (``arch.inputs`` images) and the text encoder (tokens), torch_impl's ``Encoder``. ``remat``: whole
    blocks and/or every block's attention rematerialised (``jax.checkpoint``) with ``policy``, a name from
    ``jax.checkpoint_policies`` (dots_with_no_batch_dims_saveable keeps the projections and recomputes the scores
    and softmax)."""

    arch: EncoderArch
    dtype: Any = jnp.float32
    kernel: str = "fused"
    remat: RematPlan = RematPlan()
    policy: str = "nothing_saveable"

    @nn.compact
    def __call__(self, inputs: jax.Array, train: bool = False) -> jax.Array:
        del train  # no dropout, no batch statistics: train and eval mode compute the same function
        arch = self.arch
        x, mask = self.embed(inputs)
        policy = getattr(jax.checkpoint_policies, self.policy)
        for index in range(arch.depth):
            whole = index in self.remat.blocks
            block = nn.remat(Block, policy=policy) if whole else Block
            x = block(arch, self.kernel, self.dtype, self.remat.attention and not whole, self.policy,
                      name=f"blocks_{index}")(x, mask)
        x = layer_norm(x, arch.norm_eps, "norm")
        if arch.pool == "cls":
            pooled = x[:, 0]
        else:
            pooled = x.mean(axis=1) if mask is None else masked_mean(x, mask)
        return _dense(arch.num_classes, self.dtype, "head")(pooled)

    def embed(self, inputs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """(the residual stream (batch, tokens, width), fp32 at least from here on; the padding mask, or None)."""
        arch = self.arch
        if arch.masked:  # int tokens (batch, length), length <= max_len
            arch.check_input(inputs.shape)
            stream = jnp.promote_types(self.dtype, jnp.float32)  # fp32, or fp64 in the fp64 parity checks
            x = nn.Embed(arch.vocab_size, arch.width, dtype=stream, param_dtype=jnp.float32,
                         embedding_init=trunc_init, name="token_embed")(inputs)
            pos = self.param("pos_embed", trunc_init, (1, arch.tokens, arch.width), jnp.float32)
            return x + pos[:, :inputs.shape[1]], inputs != PAD_ID
        x = nn.Conv(arch.width, (arch.patch, arch.patch), strides=(arch.patch, arch.patch), padding="VALID",
                    kernel_init=trunc_init, dtype=self.dtype, param_dtype=jnp.float32, name="patch_embed")(
            inputs.astype(self.dtype))
        x = x.reshape(x.shape[0], -1, arch.width)  # (batch, patches, width), patches row by row as torch's flatten
        if arch.pool == "cls":
            cls = self.param("cls_token", trunc_init, (1, 1, arch.width), jnp.float32)
            x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, arch.width)), x], axis=1)
        return x + self.param("pos_embed", trunc_init, (1, arch.tokens, arch.width), jnp.float32), None


def _dense(features: int, dtype: Any, name: str) -> nn.Dense:
    return nn.Dense(features, kernel_init=trunc_init, bias_init=nn.initializers.zeros, dtype=dtype,
                    param_dtype=jnp.float32, name=name)


def make_model(arch: EncoderArch, options: ModelOptions = DEFAULT_OPTIONS) -> Encoder:
    if not hasattr(jax.checkpoint_policies, options.remat_policy):
        known = [n for n in dir(jax.checkpoint_policies) if not n.startswith("_")]
        raise ValueError(f"unknown checkpoint policy '{options.remat_policy}'; known: {', '.join(known)}")
    return Encoder(arch, dtype=jnp.dtype(options.dtype), kernel=options.attention, remat=options.remat or RematPlan(),
                   policy=options.remat_policy)
