"""RunConfig: one description of a run that both trainers read, from CLI flags or a TOML file.

Flag names follow timm's where one exists (``--amp-dtype``, ``--channels-last``, ``--grad-accum-steps``,
``-j/--workers``, ``--pin-mem``, ``--torchcompile-mode``, ``--grad-checkpointing``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from common.arch import FAMILY, NORMS, STEMS, ResNetArch, resnet
from common.data.sources import KNOWN_SOURCES
from common.errors import ConfigError

# fp64 is a verification mode, not a speed technique: it proves both trainers take the same steps,
# free of fp32's rounding noise floor (which makes even one framework diverge from itself).
PRECISIONS = ("fp32", "bf16", "fp16", "fp64")
COMPILE_MODES = ("eager", "compiled")
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZERS = ("sgd", "adamw")
JAX_PARALLEL = ("sharding", "shard_map", "pmap")
PIPELINE_SPLIT_STAGE = 3  # stem + layer1..2 | layer3..4 + classifier
# twinrun infer's variants, in both frameworks (one that cannot run somewhere is skipped with its reason)
INFERENCE_VARIANTS = ("eager", "compiled", "folded", "int8", "onnxruntime", "tensorrt")
SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class RunConfig:
    # model
    model: str = "resnet18"
    stem: str = "cifar"
    width: float = 0.25
    norm: str = "batch"
    zero_init_residual: bool = False
    # data
    source: str = "cifar100"
    data: str | None = None
    png: bool = False
    synthetic_size: int = 2048
    image_size: int = 32
    # schedule of the run
    batch_size: int = 128
    steps: int | None = None
    epochs: int | None = 1
    eval_every: int = 0  # optimizer steps between evaluations; 0: only at the end
    eval_batches: int | None = None  # cap on evaluation batches (None: the whole split)
    timing_warmup: int = 2  # steps excluded from the steady-state statistics (the first includes compilation)
    # optimizer
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr: float = 0.0
    label_smoothing: float = 0.0
    seed: int = 0
    # techniques
    precision: str = "fp32"
    compile: str = "eager"
    torchcompile_mode: str = "default"
    matmul_precision: str = "highest"
    cudnn_benchmark: bool = False
    grad_accum_steps: int = 1
    lr_scale_accum: bool = False  # linear scaling rule: lr * grad_accum_steps
    grad_checkpointing: str = "none"  # none | all | stages like "2,3"
    checkpoint_policy: str = "nothing_saveable"
    channels_last: bool = False
    loss_scale_init: float = 2.0**16
    loss_scale_growth_interval: int = 2000
    # data parallel: ``devices`` replicas, each with ``batch_size`` images (global batch = batch_size * devices).
    # torch: one DDP process per device under torchrun; JAX: one process over that many local devices,
    # by ``jax_parallel`` = sharding (jit + NamedSharding), shard_map or pmap. ``processes`` > 1 spreads JAX's
    # devices over that many processes joined by jax.distributed (devices / processes each); torch always runs
    # one process per device, so it has no use for it.
    devices: int = 1
    processes: int = 1
    jax_parallel: str = "sharding"
    sync_bn: bool = False  # BatchNorm statistics over the global batch (SyncBatchNorm / axis_name)
    # pipeline parallel: 2 = the ResNet cut before stage ``PIPELINE_SPLIT_STAGE`` into two stages on two devices
    # (torch: two processes, torch.distributed.pipelining; JAX: shard_map + ppermute), GPipe over micro-batches
    pipeline_stages: int = 1
    pipeline_micro_batches: int = 4
    # loader
    workers: int = 0
    prefetch: int = 2
    pin_mem: bool = False
    persistent_workers: bool = False
    device_prefetch: int = 0
    drop_last: bool = False
    read_latency_ms: float = 0.0  # simulated slow storage: ms of waiting per training batch read
    # checkpoints
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    # profiler: the last ``profile_steps`` steps run under torch.profiler / jax.profiler (kept out of the
    # timing statistics, since tracing slows them) and write a trace under ``profile_dir``
    profile_steps: int = 0
    profile_dir: str | None = None
    # initial weights (torch-keyed .npz) shared by both frameworks for paired runs
    init_weights: str | None = None
    save_weights: str | None = None  # final weights (torch-keyed .npz, BN statistics included), e.g. for inference
    # test hooks: exit abruptly after this optimizer step (simulates a killed process); inject an inf
    fail_after_step: int | None = None
    inject_inf_at_step: int | None = None

    def __post_init__(self) -> None:
        _one_of("model", self.model, tuple(FAMILY))
        _one_of("stem", self.stem, STEMS)
        _one_of("norm", self.norm, NORMS)
        _one_of("source", self.source, KNOWN_SOURCES)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("compile", self.compile, COMPILE_MODES)
        _one_of("torchcompile_mode", self.torchcompile_mode, TORCH_COMPILE_MODES)
        _one_of("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("jax_parallel", self.jax_parallel, JAX_PARALLEL)
        for name in ("batch_size", "devices", "processes", "grad_accum_steps", "image_size", "synthetic_size", "prefetch"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("workers", "device_prefetch", "read_latency_ms", "warmup_steps", "eval_every", "timing_warmup", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if (self.steps is None) == (self.epochs is None):
            raise ConfigError("give exactly one of steps and epochs")
        if (self.steps or 1) <= 0 or (self.epochs or 1) <= 0:
            raise ConfigError("steps and epochs must be positive")
        if self.lr <= 0 or not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise ConfigError(f"need lr > 0, 0 <= momentum < 1, weight_decay >= 0; got {self.lr}, {self.momentum}, {self.weight_decay}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0 < self.width <= 8:
            raise ConfigError(f"width must be in (0, 8], got {self.width}")
        if self.loss_scale_init <= 0 or self.loss_scale_growth_interval <= 0:
            raise ConfigError("loss scaling needs a positive initial scale and growth interval")
        if self.precision != "fp16" and self.inject_inf_at_step is not None:
            raise ConfigError("inject_inf_at_step tests the fp16 loss scaler; it needs precision fp16")
        if self.precision == "fp16" and self.grad_accum_steps > 1:
            raise ConfigError("fp16 with grad_accum_steps > 1 is not supported: skipping an overflowed step would have "
                              "to discard a whole accumulation window in optax.MultiSteps; use bf16 or k = 1")
        if self.profile_steps < 0 or (self.profile_steps and not self.profile_dir):
            raise ConfigError("profile_steps must be 0 or more, and needs profile_dir")
        if self.steps is not None and self.profile_steps >= self.steps:
            raise ConfigError(f"profile_steps ({self.profile_steps}) must leave untraced steps of the {self.steps}")
        if self.sync_bn and self.norm != "batch":
            raise ConfigError(f"sync_bn synchronises BatchNorm statistics; norm is '{self.norm}'")
        if self.pipeline_stages not in (1, 2):
            raise ConfigError(f"pipeline_stages must be 1 or 2, got {self.pipeline_stages}")
        if self.pipeline_stages > 1:
            self._check_pipeline()
        if self.devices % self.processes:
            raise ConfigError(f"devices ({self.devices}) must be a multiple of processes ({self.processes}): each process "
                              f"drives the same number of devices")
        if self.processes > 1 and self.jax_parallel == "pmap":
            raise ConfigError("pmap across processes is not supported here (pmap is in maintenance mode); use jax_parallel "
                              "sharding or shard_map with processes > 1")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume needs checkpoint_dir")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError("checkpoint_every needs checkpoint_dir")
        self.checkpoint_stages  # validates the grad_checkpointing text

    def _check_pipeline(self) -> None:
        """What the 2-stage pipeline does not combine with, each named (it is built on its own, GPipe only)."""
        m = self.pipeline_micro_batches
        if m <= 0 or self.batch_size % m:
            raise ConfigError(f"pipeline_micro_batches ({m}) must be positive and divide batch_size ({self.batch_size})")
        clashes = {"devices > 1 (pipeline and data parallel together are not built)": self.devices > 1,
                   "grad_accum_steps > 1 (the micro-batches are the pipeline's own)": self.grad_accum_steps > 1,
                   "grad_checkpointing": bool(self.checkpoint_stages),
                   "precision fp16 (no loss scaler across stages)": self.precision == "fp16",
                   "checkpoint_every / resume (each process holds only its stage's optimizer state)":
                       bool(self.checkpoint_every or self.resume),
                   "profile_steps": self.profile_steps > 0}
        named = [name for name, clash in clashes.items() if clash]
        if named:
            raise ConfigError(f"pipeline_stages=2 does not combine with {', '.join(named)}")

    @property
    def checkpoint_stages(self) -> tuple[int, ...]:
        text = self.grad_checkpointing.strip().lower()
        if text in ("none", ""):
            return ()
        if text == "all":
            return (1, 2, 3, 4)
        try:
            stages = tuple(sorted({int(s) for s in text.replace("stages:", "").split(",")}))
        except ValueError:
            raise ConfigError(f"grad_checkpointing must be none, all or stage numbers like '2,3'; got '{self.grad_checkpointing}'") from None
        if not stages or min(stages) < 1 or max(stages) > 4:
            raise ConfigError(f"grad_checkpointing stages must be within 1..4, got '{self.grad_checkpointing}'")
        return stages

    @property
    def effective_lr(self) -> float:
        """The linear scaling rule: k micro-batches make a k-times batch, so the base LR is scaled by k."""
        return self.lr * (self.grad_accum_steps if self.lr_scale_accum else 1)

    def arch(self, num_classes: int) -> ResNetArch:
        return resnet(self.model, stem=self.stem, width=self.width, num_classes=num_classes,
                      zero_init_residual=self.zero_init_residual, norm=self.norm)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            values = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        flat: dict[str, Any] = {}
        for key, value in values.items():  # sections ([optimizer], [techniques], ...) are only grouping
            if isinstance(value, dict):
                flat.update({k.replace("-", "_"): v for k, v in value.items()})
            else:
                flat[key.replace("-", "_")] = value
        return cls.from_dict(flat)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} '{value}'; known: {', '.join(allowed)}")


# Flag spellings (timm's where it has one); every other field is --field-name.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "precision": ("--amp-dtype", "--precision"),
    "workers": ("-j", "--workers"),
    "batch_size": ("-b", "--batch-size"),
    "data": ("--data", "--data-dir"),
    "model": ("--model",),
    "lr": ("--lr",),
    "weight_decay": ("--weight-decay", "--wd"),
    "warmup_steps": ("--warmup-steps",),
    "label_smoothing": ("--smoothing", "--label-smoothing"),
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field (defaults left unset, so a --config file's values stay unless overridden)."""
    parser.add_argument("--config", default=None, help="TOML file with RunConfig keys (flags override it)")
    for f in fields(RunConfig):
        flags = FLAG_ALIASES.get(f.name, ("--" + f.name.replace("_", "-"),))
        if f.type in ("bool",):
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(*flags, dest=f.name, default=None, type=_parser_for(f.type), metavar=f.name.upper())


def _parser_for(type_text: str):
    if type_text.startswith("int"):
        return _optional(int)
    if type_text.startswith("float"):
        return float
    return _optional(str)


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    return parse


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    base = RunConfig.from_toml(args.config) if getattr(args, "config", None) else RunConfig()
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    if "steps" in given and "epochs" not in given:
        given["epochs"] = None
    if "epochs" in given and "steps" not in given:
        given["steps"] = None
    return base.replace(**{**given, **overrides})


def learning_rate(step: Any, config: RunConfig, total_steps: int, np_like: Any) -> Any:
    """The LR at optimizer step ``step`` (0-based), one formula for both frameworks: linear warm-up from
    lr/warmup to lr, then cosine (or constant) down to min_lr. ``np_like`` is numpy (torch side, host) or
    jax.numpy (traced inside the optax schedule)."""
    base = config.effective_lr
    step = np_like.asarray(step, dtype=np_like.float32)
    warmup = max(config.warmup_steps, 0)
    warm = np_like.minimum((step + 1.0) / max(warmup, 1), 1.0) if warmup else 1.0
    if config.schedule == "constant":
        return base * warm
    decay_steps = max(total_steps - warmup, 1)
    progress = np_like.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = config.min_lr + (base - config.min_lr) * 0.5 * (1.0 + np_like.cos(np_like.pi * progress))
    return np_like.where(step < warmup, base * warm, cosine)


def open_sources(config: RunConfig):
    """(train source, eval source) for a run; synthetic data gets ``synthetic_size`` images."""
    from common.data import load_source

    opts: dict[str, Any] = {}
    if config.source == "synthetic":
        opts = {"size": config.synthetic_size, "num_classes": 100, "seed": config.seed,
                "image_shape": (config.image_size, config.image_size, 3)}
    train = load_source(config.source, "train", config.data, png=config.png, **opts)
    if config.source == "synthetic":
        opts["size"] = max(config.synthetic_size // 4, config.batch_size)
    test = load_source(config.source, "test", config.data, png=config.png, **opts)
    return train, test


def loader_options(config: RunConfig, train: bool, rank: int = 0, world_size: int = 1):
    from common.data.loader_options import LoaderOptions

    return LoaderOptions(batch_size=config.batch_size, workers=config.workers if train else 0, prefetch=config.prefetch,
                         pin_memory=config.pin_mem, persistent_workers=config.persistent_workers,
                         device_prefetch=config.device_prefetch, drop_last=config.drop_last and train,
                         seed=config.seed, rank=rank, world_size=world_size,
                         read_latency_ms=config.read_latency_ms if train else 0.0)
