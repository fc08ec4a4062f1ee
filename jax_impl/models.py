"""The family registry (``make_model(arch, options)``, one signature for every family, torch_impl/models.py's twin)
and the ResNets built from ``common.arch`` in Flax, matching torch_impl/models.py operation for operation.

API choice: Flax **Linen**, not NNX. Linen keeps the model pure: variables are an explicit pytree
``{"params", "batch_stats"}`` that maps one-to-one onto a torch state_dict (the weight transfer is a
rename and a transpose), and ``jax.jit``, ``jax.checkpoint``, ``pmap`` and ``shard_map`` apply to the
step function directly, with no state splitting/merging in between. Layout is NHWC.

Semantics matched to torch (tested to 1e-5):
- BatchNorm: eps 1e-5; biased batch variance to normalise; running variance updated with the
  *unbiased* batch variance, as torch does; Flax momentum 0.9 (decay) == torch momentum 0.1.
  Statistics are computed in fp32 whatever the compute dtype.
- Convolutions pad symmetrically like torch (never 'SAME', which pads stride-2 convs on one side).
- Initialisation as torchvision: kaiming-normal fan_out (untruncated) convs, unit/zero norm affine,
  torch's default Linear init (uniform +-1/sqrt(fan_in) for weight and bias).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.arch import BlockSpec, ResNetArch, group_count
from common.model_options import DEFAULT_OPTIONS, ModelOptions
from common.registry import Registry
from jax_impl import transformer

BN_EPS = 1e-5
BN_MOMENTUM = 0.9  # Flax convention: decay of the running statistic (torch's 0.1 is 1 - 0.9)

conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
dense_kernel_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def dense_bias_init(fan_in: int) -> Callable[..., jax.Array]:
    bound = 1.0 / fan_in**0.5

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class BatchNorm(nn.Module):
    """BatchNorm with torch's exact semantics; ``axis_name`` averages statistics across replicas."""

    use_running_average: bool
    momentum: float = BN_MOMENTUM
    epsilon: float = BN_EPS
    dtype: Any = None
    scale_init: Callable[..., jax.Array] = nn.initializers.ones
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        channels = x.shape[-1]
        scale = self.param("scale", self.scale_init, (channels,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (channels,), jnp.float32)
        running_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((channels,), jnp.float32))
        running_var = self.variable("batch_stats", "var", lambda: jnp.ones((channels,), jnp.float32))
        xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))  # statistics in fp32 at least
        if self.use_running_average:
            mean, var = running_mean.value, running_var.value
        else:
            axes = tuple(range(x.ndim - 1))
            count = xf.size // channels
            mean = xf.mean(axes)
            if self.axis_name is not None:
                mean = jax.lax.pmean(mean, self.axis_name)
            var = ((xf - mean) ** 2).mean(axes)
            if self.axis_name is not None:
                var = jax.lax.pmean(var, self.axis_name)
                count = count * jax.lax.psum(1, self.axis_name)
            if not self.is_initializing():
                unbiased = var * (count / max(count - 1, 1))
                running_mean.value = self.momentum * running_mean.value + (1 - self.momentum) * mean
                running_var.value = self.momentum * running_var.value + (1 - self.momentum) * unbiased
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias
        return y.astype(self.dtype or x.dtype)


class FoldedNorm(nn.Module):
    """What an inference-time BatchNorm leaves once folded into the convolution before it: a bias."""

    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
        return (x + bias.astype(x.dtype)).astype(self.dtype or x.dtype)


class GroupNorm(nn.Module):
    """GroupNorm computed in fp32, torch's eps and group count."""

    dtype: Any = None
    scale_init: Callable[..., jax.Array] = nn.initializers.ones

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        stats_dtype = jnp.promote_types(x.dtype, jnp.float32)  # fp32 at least
        norm = nn.GroupNorm(num_groups=group_count(x.shape[-1]), epsilon=BN_EPS, dtype=stats_dtype,
                            param_dtype=jnp.float32, scale_init=self.scale_init, name="gn")
        return norm(x.astype(stats_dtype)).astype(self.dtype or x.dtype)


class LayerOptions(nn.Module):
    """Shared fields of every module below (compute dtype, norm kind, train mode, BN axis)."""

    norm: str = "batch"
    train: bool = False
    dtype: Any = jnp.float32
    bn_axis_name: str | None = None

    def make_norm(self, name: str, zero_init: bool = False) -> nn.Module:
        scale_init = nn.initializers.zeros if zero_init else nn.initializers.ones
        if self.norm == "group":
            return GroupNorm(dtype=self.dtype, scale_init=scale_init, name=name)
        if self.norm == "folded":
            return FoldedNorm(dtype=self.dtype, name=name)
        return BatchNorm(use_running_average=not self.train, dtype=self.dtype, scale_init=scale_init,
                         axis_name=self.bn_axis_name, name=name)

    def make_conv(self, features: int, kernel: int, stride: int, name: str) -> nn.Conv:
        pad = kernel // 2
        return nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                       use_bias=False, kernel_init=conv_init, dtype=self.dtype, param_dtype=jnp.float32, name=name)


class _Block(LayerOptions):
    """Fields and shortcut shared by both block kinds (torch_impl's ``_downsample``)."""

    spec: BlockSpec = None  # type: ignore[assignment]
    zero_init_residual: bool = False

    def shortcut(self, x: jax.Array) -> jax.Array:
        s = self.spec
        if not s.has_downsample:
            return x
        return self.make_norm("downsample_bn")(self.make_conv(s.out_channels, 1, s.stride, "downsample_conv")(x))


class BasicBlock(_Block):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        identity = self.shortcut(x)
        out = nn.relu(self.make_norm("bn1")(self.make_conv(s.planes, 3, s.stride, "conv1")(x)))
        out = self.make_norm("bn2", self.zero_init_residual)(self.make_conv(s.out_channels, 3, 1, "conv2")(out))
        return nn.relu(out + identity)


class Bottleneck(_Block):
    """torchvision's ResNet v1.5: the stride sits on the 3x3 convolution."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        identity = self.shortcut(x)
        out = nn.relu(self.make_norm("bn1")(self.make_conv(s.planes, 1, 1, "conv1")(x)))
        out = nn.relu(self.make_norm("bn2")(self.make_conv(s.planes, 3, s.stride, "conv2")(out)))
        out = self.make_norm("bn3", self.zero_init_residual)(self.make_conv(s.out_channels, 1, 1, "conv3")(out))
        return nn.relu(out + identity)


class ResNet(nn.Module):
    """``checkpoint_stages``: stages whose blocks are rematerialised (jax.checkpoint) with
    ``checkpoint_policy``, a name from ``jax.checkpoint_policies`` (e.g. nothing_saveable, dots_saveable)."""

    arch: ResNetArch
    dtype: Any = jnp.float32
    checkpoint_stages: frozenset[int] = frozenset()
    checkpoint_policy: str = "nothing_saveable"
    bn_axis_name: str | None = None
    folded_norm: bool = False  # inference: every BatchNorm folded into its convolution (jax_impl/inference.py)
    # Pipeline stages (jax_impl/pipeline.py): "front" = stem and the stages before ``split_stage`` (images in,
    # activations out), "back" = the rest and the classifier. Parameter names are the whole model's.
    part: str = "all"
    split_stage: int = 3

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        arch = self.arch
        norm = "folded" if self.folded_norm else arch.norm
        options = dict(norm=norm, train=train, dtype=self.dtype, bn_axis_name=self.bn_axis_name)
        x = x.astype(self.dtype)
        if self.part != "back":
            x = self._stem(x, norm, train)
        plain = BasicBlock if arch.block == "basic" else Bottleneck
        policy = getattr(jax.checkpoint_policies, self.checkpoint_policy)
        remat = nn.remat(plain, policy=policy)
        for spec in arch.blocks:
            in_front = spec.stage < self.split_stage
            if (self.part == "front" and not in_front) or (self.part == "back" and in_front):
                continue
            block_cls = remat if spec.stage in self.checkpoint_stages else plain
            x = block_cls(spec=spec, zero_init_residual=arch.zero_init_residual, name=spec.flax_name, **options)(x)
        if self.part == "front":
            return x
        x = jnp.mean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), axis=(1, 2)).astype(self.dtype)
        # The classifier runs in the compute dtype, as under torch autocast; the loss casts logits to fp32.
        return nn.Dense(arch.num_classes, kernel_init=dense_kernel_init,
                        bias_init=dense_bias_init(arch.feature_channels),
                        dtype=self.dtype, param_dtype=jnp.float32, name="fc")(x)

    def _stem(self, x: jax.Array, norm: str, train: bool) -> jax.Array:
        arch = self.arch
        if arch.stem == "cifar":
            x = nn.Conv(arch.stem_channels, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, kernel_init=conv_init,
                        dtype=self.dtype, param_dtype=jnp.float32, name="conv1")(x)
        else:
            x = nn.Conv(arch.stem_channels, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), use_bias=False,
                        kernel_init=conv_init, dtype=self.dtype, param_dtype=jnp.float32, name="conv1")(x)
        x = nn.relu(_norm(norm, train, self.dtype, self.bn_axis_name, "bn1")(x))
        if arch.stem == "imagenet":
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        return x


def _norm(kind: str, train: bool, dtype: Any, axis_name: str | None, name: str) -> nn.Module:
    if kind == "group":
        return GroupNorm(dtype=dtype, name=name)
    if kind == "folded":
        return FoldedNorm(dtype=dtype, name=name)
    return BatchNorm(use_running_average=not train, dtype=dtype, axis_name=axis_name, name=name)


def resnet(arch: ResNetArch, options: ModelOptions = DEFAULT_OPTIONS) -> ResNet:
    if not hasattr(jax.checkpoint_policies, options.remat_policy):
        known = [n for n in dir(jax.checkpoint_policies) if not n.startswith("_")]
        raise ValueError(f"unknown checkpoint policy '{options.remat_policy}'; known: {', '.join(known)}")
    return ResNet(arch, dtype=jnp.dtype(options.dtype), checkpoint_stages=frozenset(options.remat),
                  checkpoint_policy=options.remat_policy, bn_axis_name=options.bn_axis_name)


# family -> its builder, all of one signature; a workload from outside the repository adds its own
MODELS = Registry("jax", {"resnet": resnet, "vit": transformer.make_model, "text": transformer.make_model})


def make_model(arch: Any, options: ModelOptions = DEFAULT_OPTIONS) -> nn.Module:
    """The Flax model of ``arch``'s family, set up with the run's ``options``."""
    return MODELS.build(arch, options)


def init_variables(model: Any, seed: int = 0, image_size: int = 32) -> dict[str, Any]:
    """The variables of a model of any family, from an example input of its description's kind (only its shape
    matters: a text encoder's position table has max_len rows whatever the example's length).

    One jitted program keyed by XLA's RngBitGenerator (``rbg``): op by op, Flax's init compiles every primitive on
    its own (9.5 s for a width-1/8 ResNet-18 here), and threefry's jitted init of that model took 8.7-15.8 s to
    compile on a 2-core AMD EPYC, rbg's 2.3 s. The values follow the seed, the same on every run of one backend
    (rbg's bits may differ between XLA versions or backends: the paired runs start from torch's exported weights)."""
    example = jnp.asarray(model.arch.example(1, image_size))
    return jax.jit(lambda key: model.init(key, example, train=False))(jax.random.key(seed, impl="rbg"))
