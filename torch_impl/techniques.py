"""The single-device technique switches on the torch side; jax_impl/techniques.py mirrors them. Mixed precision is
torch_impl/amp.py's, compilation torch_impl/compilation.py's."""

from __future__ import annotations

import torch

from common.applicability import no_effect_notes
from common.config import RunConfig


def apply_flags(config: RunConfig) -> list[str]:
    """Sets matmul precision and cuDNN flags process-wide; returns notes on what has no effect here (on this
    process's device: CUDA where there is one, as torch_impl/data.py's ``current_device``).

    ``highest`` also switches off cuDNN's TF32 convolutions (on by default in torch), so fp32 means fp32
    on both frameworks until the flags rung."""
    torch.set_float32_matmul_precision(config.matmul_precision)
    torch.backends.cuda.matmul.allow_tf32 = config.matmul_precision != "highest"
    torch.backends.cudnn.allow_tf32 = config.matmul_precision != "highest"
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    platform = "cuda" if torch.cuda.is_available() else "cpu"
    return no_effect_notes(config, "torch", platform)  # the one table of both frameworks


def param_dtype(config: RunConfig) -> torch.dtype:
    return torch.float64 if config.precision == "fp64" else torch.float32
