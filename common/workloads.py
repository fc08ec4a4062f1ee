"""The workload seam: a model family chosen by name, with its architecture description, its data and its loss.

Adding a family touches its entry here, its description (common/arch*.py), its two model files and its data
source: never the loop (common/loop.py) or the driver (experiments/). Both backends build the model of
``workload_for(config).family`` from ``arch(config, num_classes)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.arch import FAMILY, resnet
from common.errors import ConfigError

if TYPE_CHECKING:  # config imports this module for its model names
    from common.config import RunConfig
    from common.data import Source
    from common.data.loader_options import LoaderOptions

SYNTHETIC_CLASSES = 100  # the synthetic source's label count


@dataclass(frozen=True)
class Workload:
    family: str  # the key both backends build their model by
    models: tuple[str, ...]  # the --model names of this family
    loss: str  # what both sides minimise (each framework's formula of it lives in its train.py)
    describe: Callable[[RunConfig, int], Any]  # (config, num_classes) -> the architecture both sides build from


def _resnet(config: RunConfig, num_classes: int) -> Any:
    return resnet(config.model, stem=config.stem, width=config.width, num_classes=num_classes,
                  zero_init_residual=config.zero_init_residual, norm=config.norm)


WORKLOADS: dict[str, Workload] = {
    "resnet": Workload("resnet", tuple(FAMILY), "softmax cross-entropy (label smoothing optional)", _resnet),
}


def known_models() -> tuple[str, ...]:
    return tuple(name for workload in WORKLOADS.values() for name in workload.models)


def workload_for(model: str) -> Workload:
    for workload in WORKLOADS.values():
        if model in workload.models:
            return workload
    raise ConfigError(f"unknown model '{model}'; known: {', '.join(known_models())}")


def arch(config: RunConfig, num_classes: int) -> Any:
    """The architecture description of ``config``'s model with ``num_classes`` outputs (from its data)."""
    return workload_for(config.model).describe(config, num_classes)


def open_sources(config: RunConfig) -> tuple[Source, Source]:
    """(train source, eval source) for a run; synthetic data gets ``synthetic_size`` images."""
    from common.data import load_source

    opts: dict[str, Any] = {}
    if config.source == "synthetic":
        opts = {"size": config.synthetic_size, "num_classes": SYNTHETIC_CLASSES, "seed": config.seed,
                "image_shape": (config.image_size, config.image_size, 3)}
    train = load_source(config.source, "train", config.data, png=config.png, **opts)
    if config.source == "synthetic":
        opts["size"] = max(config.synthetic_size // 4, config.batch_size)
    test = load_source(config.source, "test", config.data, png=config.png, **opts)
    return train, test


def num_classes(config: RunConfig) -> int:
    """The class count of ``config``'s data: the classifier's width (never assumed)."""
    return open_sources(config)[0].num_classes


def loader_options(config: RunConfig, train: bool, rank: int = 0, world_size: int = 1) -> LoaderOptions:
    """The loader knobs of a run. Evaluation reads in the main process, without the simulated storage latency;
    whether images are augmented and shuffled is the loader's ``train`` argument, given alongside."""
    from common.data.loader_options import LoaderOptions

    return LoaderOptions(batch_size=config.batch_size, workers=config.workers if train else 0, prefetch=config.prefetch,
                         pin_memory=config.pin_mem, persistent_workers=config.persistent_workers,
                         device_prefetch=config.device_prefetch, drop_last=config.drop_last and train,
                         seed=config.seed, rank=rank, world_size=world_size,
                         read_latency_ms=config.read_latency_ms if train else 0.0)
