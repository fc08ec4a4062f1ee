"""A workload from outside twinrun's packages: a small MLP on a generated set of noisy class prototypes.

    twinrun parity --model examples/mlp_workload.py:MLP
    twinrun ladder --preset tiny --model examples/mlp_workload.py:MLP --repeats 1 --no-ablations

A workload brings its description (what the model is, and the properties the frameworks read instead of its
family's name: common/workloads.py's ``Description``), a builder per framework taking (description,
common.model_options.ModelOptions) (either may be None: that framework's runs are skipped, with the reason), its
data source (common/data/sources.py's ``Source``) and its loss (both trainers minimise LOSS). The torch model's
names are the Flax model's (``fc1``, ``fc2``), so paired runs start from the same transferred weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from common.data.sources import ArraySource
from common.model_options import ModelOptions
from common.workloads import LOSS, Workload

CLASSES = 10
EXAMPLES = {"train": 512, "test": 128}
NOISE = 48.0  # pixel noise around each class's prototype (0..255): well apart, learnt in a few steps (a check)


@dataclass(frozen=True)
class MlpArch:
    name: str
    image_size: int
    hidden: int
    num_classes: int

    family = "mlp"
    inputs = "images"
    attention = False
    int4 = False

    def example(self, batch: int, image_size: int) -> np.ndarray:
        return np.zeros((batch, image_size, image_size, 3), np.float32)


def describe(config: Any, num_classes: int) -> MlpArch:
    return MlpArch("mlp", config.image_size, hidden=64, num_classes=num_classes)


def sources(config: Any) -> tuple[ArraySource, ArraySource]:
    """(train, test): each image a class's random prototype plus noise, the same for every run (seed 0)."""
    rng = np.random.default_rng(0)
    shape = (config.image_size, config.image_size, 3)
    prototypes = rng.uniform(0, 255, size=(CLASSES, *shape))
    split = {}
    for name, count in EXAMPLES.items():
        labels = rng.integers(0, CLASSES, size=count)
        images = np.clip(prototypes[labels] + rng.normal(0, NOISE, size=(count, *shape)), 0, 255).astype(np.uint8)
        split[name] = ArraySource(f"prototypes-{name}", images, labels, CLASSES, augmentations=())
    return split["train"], split["test"]


def torch_mlp(arch: MlpArch, options: ModelOptions) -> Any:
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(arch.image_size ** 2 * 3, arch.hidden)
            self.fc2 = nn.Linear(arch.hidden, arch.num_classes)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = images.permute(0, 2, 3, 1).flatten(1)  # NCHW -> NHWC order: the Flax model's, so weights transfer
            return self.fc2(torch.relu(self.fc1(x)))

    return Mlp()


def flax_mlp(arch: MlpArch, options: ModelOptions) -> Any:
    import flax.linen as nn
    import jax.numpy as jnp

    class Mlp(nn.Module):
        arch: MlpArch  # the trainer reads its description (num_classes) from the model
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, images: Any, train: bool = False) -> Any:
            x = images.astype(self.dtype).reshape(images.shape[0], -1)
            x = nn.relu(nn.Dense(self.arch.hidden, dtype=self.dtype, param_dtype=jnp.float32, name="fc1")(x))
            return nn.Dense(self.arch.num_classes, dtype=self.dtype, param_dtype=jnp.float32, name="fc2")(x)

    return Mlp(arch, jnp.dtype(options.dtype))


MLP = Workload(family="mlp", models=("mlp",), loss=LOSS, describe=describe, sources=sources,
               torch_model=torch_mlp, flax_model=flax_mlp, summary=lambda config: "mlp (hidden 64)",
               no_inference={"folded": "BatchNorm folding: the MLP has no BatchNorm"},
               recipe={"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.0})
