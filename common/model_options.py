"""The run's techniques a model builder reads, built once from the RunConfig.

Both frameworks' registries (torch_impl/models.py, jax_impl/models.py) build every family through one signature,
``make_model(arch, options)``: the description says what the model is, these options how the run sets it up. A
builder reads the fields that apply to its family and framework (channels_last is torch's, the checkpoint policy and
the BatchNorm axis are JAX's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.config import RunConfig


@dataclass(frozen=True)
class ModelOptions:
    dtype: str = "float32"  # the compute dtype's name (JAX computes in it; torch's autocast casts around the model)
    attention: str = "fused"  # the attention kernel: fused or naive (a model without attention ignores it)
    remat: Any = ()  # what the backward pass recomputes, in the family's terms (ResNet stages; a RematPlan)
    remat_policy: str = "nothing_saveable"  # a jax.checkpoint_policies name (JAX)
    channels_last: bool = False  # torch's memory format for the convolutions
    bn_axis_name: str | None = None  # the axis a JAX BatchNorm averages its statistics over (sync_bn)

    @classmethod
    def of(cls, config: RunConfig, dtype: str = "float32", bn_axis_name: str | None = None) -> ModelOptions:
        """The options of ``config``'s run; ``dtype`` and ``bn_axis_name`` come from the framework's techniques."""
        return cls(dtype=dtype, attention=config.attention, remat=config.remat_plan,
                   remat_policy=config.remat_policy, channels_last=config.channels_last, bn_axis_name=bn_axis_name)


DEFAULT_OPTIONS = ModelOptions()  # fp32, the fused kernel, nothing recomputed: a builder's default
