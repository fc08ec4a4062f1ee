"""The workload seam: a model family chosen by name, with its architecture description, its data and its loss.

Adding a family touches its entry here, its description (common/arch*.py), its two model files and its data
source: never the loop (common/loop.py) or the driver (experiments/). Both backends build the model of
``arch(config, num_classes)`` through their registry (torch_impl/models.py, jax_impl/models.py), by its family.

A workload can also come from outside the repository: ``--model pkg.module:NAME`` or ``--model path/to/file.py:NAME``
names a ``Workload`` that brings its description, its torch and Flax builders (either may be None: that
framework's runs are skipped, with the reason), its data source and its loss (``load_workload``). The model name
of such a run is that spec: it travels in the RunConfig, so each measured run's own process loads it again.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from common.arch import FAMILY, parse_remat_stages, resnet
from common.arch_encoder import TEXT_FAMILY, VIT_FAMILY, parse_remat, text, vit
from common.errors import ConfigError, DataError

if TYPE_CHECKING:  # config imports this module for its model names (annotations only here)
    from common.config import RunConfig
    from common.data import Source
    from common.data.loader_options import LoaderOptions
    from common.model_options import ModelOptions

SYNTHETIC_CLASSES = 100  # the synthetic source's label count
FRAMEWORK_NAMES = {"torch": "torch", "jax": "Flax"}


class Description(Protocol):
    """What the frameworks read from a description (common/arch.py's ResNetArch, common/arch_encoder.py's
    EncoderArch, a workload's own): what differs by family is said here, never tested by the family's name."""

    name: str
    family: str  # the key of each framework's registry
    num_classes: int
    inputs: str  # "images" (NHWC float) or "tokens" (int token ids with a padding mask)
    attention: bool  # whether --attention chooses a kernel in it
    int4: bool  # whether INT4 weight-only is measured on it

    def example(self, batch: int, image_size: int) -> np.ndarray: ...


Builder = Callable[[Any, "ModelOptions"], Any]  # (description, options) -> a torch or Flax module


def _no_remat(config: RunConfig) -> tuple[int, ...]:
    if config.remat.strip().lower() not in ("none", ""):
        raise ConfigError(f"model '{config.model}' recomputes nothing in the backward pass: remat must be none, got "
                          f"'{config.remat}'")
    return ()


@dataclass(frozen=True)
class Workload:
    family: str  # the key both backends build their model by
    models: tuple[str, ...]  # the --model names of this family
    loss: str  # what both sides minimise (each framework's formula of it lives in its train.py)
    describe: Callable[[RunConfig, int], Any]  # (config, num_classes) -> the architecture both sides build from
    # config -> what the model recomputes in the backward pass, in the family's terms (ResNet stages; a RematPlan)
    remat: Callable[[RunConfig], Any] = _no_remat
    # the sweep's choices of remat, from none to the most recomputation
    remat_choices: Callable[[RunConfig], tuple[str, ...]] = lambda config: ("none",)
    pipeline: bool = False  # whether pipeline_stages=2 can split it (the ResNet's cut between stages)
    attention: bool = False  # whether --attention chooses anything in it
    # config -> the model in a few words, for console titles (a ResNet's width multiplier; a ViT's shape and kernel)
    summary: Callable[[RunConfig], str] = lambda config: config.model
    # inference variants (common.inference.VARIANTS) that mean nothing for the family -> why, for the
    # skipped row: the driver asks this, never the model's name
    no_inference: Mapping[str, str] = field(default_factory=dict)
    examples: str = "images"  # what one example is, for throughput columns (images/s, texts/s)
    # config -> (train, eval) sources; None: the images --source names (common/data/sources.py)
    sources: Callable[[RunConfig], tuple[Source, Source]] | None = None
    # A workload from outside the repository brings its builders (None: that framework has no model of it); the
    # built-in families' builders are the frameworks' registries'
    torch_model: Builder | None = None
    flax_model: Builder | None = None
    recipe: Mapping[str, Any] = field(default_factory=dict)  # RunConfig fields it trains with over a preset's
    spec: str | None = None  # where it was loaded from (--model); None: built in

    def missing(self, framework: str) -> str | None:
        """Why ``framework`` (torch or jax) cannot run this workload, or None when it can."""
        if self.spec is None or self.builder(framework) is not None:
            return None
        return f"the workload {self.spec} provides no {FRAMEWORK_NAMES[framework]} model"

    def builder(self, framework: str) -> Builder | None:
        return {"torch": self.torch_model, "jax": self.flax_model}[framework]


def _resnet(config: RunConfig, num_classes: int) -> Any:
    return resnet(config.model, stem=config.stem, width=config.width, num_classes=num_classes,
                  zero_init_residual=config.zero_init_residual, norm=config.norm)


def _vit(config: RunConfig, num_classes: int) -> Any:
    return vit(config.model, num_classes=num_classes, image_size=config.image_size, pool=config.pool)


def _text(config: RunConfig, num_classes: int) -> Any:
    return text(config.model, num_classes=num_classes, max_len=config.max_len, pool=config.pool)


def _text_sources(config: RunConfig) -> tuple[Source, Source]:
    from common.data.text import load_text_source

    if config.data is None:
        raise ConfigError("source text needs --data: a folder of train.csv/test.csv (AG News) or "
                          "train.jsonl/test.jsonl")
    train, test = (load_text_source(config.data, split, max_len=config.max_len) for split in ("train", "test"))
    return train, test  # type: ignore[return-value]


def _depth(model: str) -> int:
    return {**VIT_FAMILY, **TEXT_FAMILY}[model][1]


def _transformer_remat(config: RunConfig) -> Any:
    return parse_remat(config.remat, _depth(config.model))


def _transformer_remat_choices(config: RunConfig) -> tuple[str, ...]:
    """none, every block's attention (the article's advice), the first half of the blocks whole, every block whole."""
    depth = _depth(config.model)
    return "none", "attention", ",".join(str(n) for n in range(1, depth // 2 + 1)), "all"


def _resnet_summary(config: RunConfig) -> str:
    return f"{config.model} width={config.width}"


def _vit_summary(config: RunConfig) -> str:
    """The shape the name stands for (--width does not change it), the pooling and the attention kernel."""
    width, depth, heads = VIT_FAMILY[config.model]
    return (f"{config.model} (width {width}, depth {depth}, heads {heads}, pool {config.pool}, "
            f"attention {config.attention})")


def _text_summary(config: RunConfig) -> str:
    width, depth, heads = TEXT_FAMILY[config.model]
    return (f"{config.model} (width {width}, depth {depth}, heads {heads}, max_len {config.max_len}, "
            f"batching {config.batching}, attention {config.attention})")


# A ViT normalises with LayerNorm, which reads each token's own statistics at inference too: nothing to fold.
VIT_NO_INFERENCE = {"folded": "BatchNorm folding: a ViT has no BatchNorm (its LayerNorms normalise each token by its "
                              "own statistics, at inference as in training), so there is nothing to fold"}
LOSS = "softmax cross-entropy (label smoothing optional)"
WORKLOADS: dict[str, Workload] = {
    "resnet": Workload("resnet", tuple(FAMILY), LOSS, _resnet, remat=lambda config: parse_remat_stages(config.remat),
                       remat_choices=lambda config: ("none", "3,4", "all"), pipeline=True, attention=False,
                       summary=_resnet_summary),
    "vit": Workload("vit", tuple(VIT_FAMILY), LOSS, _vit,
                    remat=_transformer_remat, remat_choices=_transformer_remat_choices, pipeline=False, attention=True,
                    summary=_vit_summary, no_inference=VIT_NO_INFERENCE),
    # the same encoder blocks on variable-length byte tokens with a padding mask (common/arch_encoder.py)
    "text": Workload("text", tuple(TEXT_FAMILY), LOSS, _text, remat=_transformer_remat,
                     remat_choices=_transformer_remat_choices, pipeline=False, attention=True, summary=_text_summary,
                     no_inference={"folded": VIT_NO_INFERENCE["folded"].replace("a ViT", "a text encoder")},
                     examples="texts", sources=_text_sources),
}
EXTERNAL: dict[str, Workload] = {}  # spec (--model) -> the workload loaded from outside the repository


def is_spec(model: str) -> bool:
    """Whether ``model`` names a workload outside the repository (``pkg.module:NAME``, ``path/to/file.py:NAME``)."""
    return ":" in model


class ModelNames(tuple):
    """The known --model names (argparse lists them in --help), and any workload spec besides: ``in`` admits one,
    and loading it says what is wrong with it."""

    def __contains__(self, model: object) -> bool:
        return super().__contains__(model) or (isinstance(model, str) and is_spec(model))


def _module_of(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ConfigError(f"no workload file {path} (--model path/to/file.py:NAME)")
        name = f"twinrun_workload_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up by name
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import the workload module '{target}' ({exc}); give a module on the Python path or "
                          f"a .py file (--model path/to/file.py:NAME)") from None


def load_workload(spec: str) -> Workload:
    """The ``Workload`` that ``spec`` (``pkg.module:NAME`` or ``path/to/file.py:NAME``) names, loaded once per
    process; its model name is the spec."""
    if spec in EXTERNAL:
        return EXTERNAL[spec]
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"a workload is named module:NAME or path/to/file.py:NAME, got '{spec}'")
    workload = getattr(_module_of(target), name, None)
    if not isinstance(workload, Workload):
        raise ConfigError(f"{target} has no Workload named {name} (found {type(workload).__name__})")
    if workload.family in WORKLOADS:
        raise ConfigError(f"the workload {spec} takes the built-in family name '{workload.family}': give it its own")
    if workload.loss != LOSS:
        raise ConfigError(f"the workload {spec} minimises '{workload.loss}'; both trainers minimise {LOSS} only")
    if workload.torch_model is None and workload.flax_model is None:
        raise ConfigError(f"the workload {spec} provides neither a torch nor a Flax model")
    if clash := next((other.spec for other in EXTERNAL.values() if other.family == workload.family), None):
        raise ConfigError(f"the workload {spec} takes the family '{workload.family}' of {clash}, loaded before: the "
                          f"registries find a builder by family, so give each workload its own")
    EXTERNAL[spec] = dataclasses.replace(workload, models=(spec,), spec=spec)
    return EXTERNAL[spec]


def builder_of(family: str, framework: str) -> Builder | None:
    """The builder a loaded workload brings for ``family`` in ``framework`` (torch or jax), or None."""
    return next((w.builder(framework) for w in EXTERNAL.values() if w.family == family), None)


def known_models() -> tuple[str, ...]:
    return ModelNames(name for workload in (*WORKLOADS.values(), *EXTERNAL.values()) for name in workload.models)


def workload_for(model: str) -> Workload:
    if is_spec(model):
        return load_workload(model)
    for workload in WORKLOADS.values():
        if model in workload.models:
            return workload
    raise ConfigError(f"unknown model '{model}'; known: {', '.join(known_models())}")


def arch(config: RunConfig, num_classes: int) -> Any:
    """The architecture description of ``config``'s model with ``num_classes`` outputs (from its data)."""
    workload = workload_for(config.model)
    description = workload.describe(config, num_classes)
    if description.family != workload.family:  # the registries build by the description's family
        raise ConfigError(f"{config.model} describes a model of the family '{description.family}', not its "
                          f"workload's '{workload.family}'")
    return description


def open_sources(config: RunConfig) -> tuple[Source, Source]:
    """(train source, eval source) for a run; synthetic data gets ``synthetic_size`` images."""
    from common.data import Source, load_source

    sources = workload_for(config.model).sources
    if sources is not None:
        train, test = sources(config)
        if not isinstance(train, Source) or not isinstance(test, Source):
            raise DataError(f"the data source of {config.model} gives no Source (common/data/sources.py: len, "
                            f"[i] -> (example, label), name, num_classes, synthetic, augmentations)")
        check_batch_fits(config, len(train), train.name)
        return train, test
    opts: dict[str, Any] = {}
    if config.source == "synthetic":
        opts = {"size": config.synthetic_size, "num_classes": SYNTHETIC_CLASSES, "seed": config.seed,
                "image_shape": (config.image_size, config.image_size, 3)}
    train = load_source(config.source, "train", config.data, png=config.png, **opts)
    check_batch_fits(config, len(train), train.name)
    if config.source == "synthetic":
        opts["size"] = max(config.synthetic_size // 4, config.batch_size)
    test = load_source(config.source, "test", config.data, png=config.png, **opts)
    return train, test


def check_batch_fits(config: RunConfig, examples: int, name: str) -> None:
    """A global batch (batch size x devices) larger than the train split is refused by name before anything is
    built: its "batch" would be the whole split, not what was asked for."""
    if config.batch_size * config.devices > examples:
        raise ConfigError(f"batch_size {config.batch_size} x devices {config.devices} is more than the {examples} "
                          f"training examples of {name}: give a batch size of at most {examples // config.devices}")


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
                         read_latency_ms=config.read_latency_ms if train else 0.0, batching=config.batching,
                         buckets=config.buckets, max_len=config.max_len)
