"""RunConfig from the command line and TOML files.

One flag per RunConfig field, in argparse groups as timm's train.py has them; flag names follow timm's where
one exists (``--amp-dtype``, ``--channels-last``, ``--grad-accum-steps``, ``-j/--workers``, ``--pin-mem``,
``--torchcompile-mode``, ``--grad-checkpointing``). Defaults are left unset on the parser, so a ``--config``
file's values stay unless a flag overrides them; the help shows RunConfig's default.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from common import config as cfg
from common.config import RunConfig
from common.data.sources import KNOWN_SOURCES
from common.errors import ConfigError
from common.workloads import known_models, workload_for

# group -> {field: (help, choices or None)}; every RunConfig field is in exactly one group (tested)
GROUPS: dict[str, dict[str, tuple[str, tuple[str, ...] | None]]] = {
    "data": {
        "source": ("data set (text: a folder of AG News train.csv/test.csv or train.jsonl/test.jsonl; the default "
                   "of a text model)", KNOWN_SOURCES + cfg.TEXT_SOURCES),
        "data": ("CIFAR archive (.tar.gz) or extracted folder, or a text folder; default: a generated one", None),
        "png": ("read the images as PNG files (the decode cost of a real image folder)", None),
        "synthetic_size": ("images in the synthetic source", None),
        "image_size": ("image side in pixels (synthetic source)", None),
        "batching": ("text: pad each batch to the split's longest text (pad-max), to the batch's longest "
                     "(pad-longest) or to the smallest bucket that holds it (bucket)", cfg.BATCHINGS),
        "buckets": ("text: bucket sizes, pow2 (16, 32, 64 ... max_len) or N (multiples of N)", None),
    },
    "model": {
        "model": ("architecture", None),
        "stem": ("cifar: 3x3 conv; imagenet: 7x7 conv + max-pool", cfg.STEMS),
        "width": ("channel multiplier of the ResNet (a ViT's width is its name's: vit-micro 64, vit-tiny 192, "
                  "vit-s 384)", None),
        "norm": ("normalisation layer", cfg.NORMS),
        "zero_init_residual": ("zero the last norm scale of every residual block", None),
        "pool": ("transformer: classify from the class token or the mean of the tokens", cfg.POOLS),
        "attention": ("transformer attention kernel: naive (softmax(QK^T/sqrt(d))V written out) or fused "
                      "(F.scaled_dot_product_attention / jax.nn.dot_product_attention)", cfg.ATTENTION_KERNELS),
        "max_len": ("text: tokens kept of each text ([CLS] + UTF-8 bytes), the position table's length", None),
    },
    "optimizer": {
        "optimizer": ("torch.optim formulas, mirrored in optax", cfg.OPTIMIZERS),
        "lr": ("base learning rate", None),
        "momentum": ("SGD momentum", None),
        "weight_decay": ("SGD: coupled; AdamW: decoupled", None),
        "schedule": ("LR schedule after the warm-up", cfg.SCHEDULES),
        "warmup_steps": ("linear LR warm-up, in optimizer steps", None),
        "min_lr": ("the cosine schedule's floor", None),
        "label_smoothing": ("label smoothing of the cross-entropy", None),
        "grad_accum_steps": ("micro-batches per optimizer step (gradient accumulation)", None),
        "lr_scale_accum": ("linear scaling rule: lr x grad_accum_steps", None),
        "seed": ("initialisation, shuffling and augmentation seed", None),
    },
    "schedule of the run": {
        "batch_size": ("images per step and replica (per micro-batch with accumulation)", None),
        "steps": ("optimizer steps (give steps or epochs)", None),
        "epochs": ("epochs (give steps or epochs)", None),
        "eval_every": ("optimizer steps between evaluations; 0: at the end only", None),
        "eval_batches": ("cap on evaluation batches; none: the whole test split", None),
        "target_accuracy": ("stop at the first evaluation whose accuracy reaches A; evaluates at every epoch end "
                            "(and every --eval-every steps)", None),
    },
    "precision": {
        "precision": ("compute dtype; fp64 is the verification mode", cfg.PRECISIONS),
        "matmul_precision": ("fp32 matmul precision (torch set_float32_matmul_precision / JAX "
                             "default_matmul_precision)",
                             cfg.MATMUL_PRECISIONS),
        "loss_scale_init": ("fp16: initial dynamic loss scale", None),
        "loss_scale_growth_interval": ("fp16: steps without overflow before the scale doubles", None),
    },
    "compile": {
        "compile": ("torch.compile / jax.jit, or eager (JAX: op by op)", cfg.COMPILE_MODES),
        "torchcompile_mode": ("torch.compile mode", cfg.TORCH_COMPILE_MODES),
        "compile_dynamic": ("torch.compile and a new input shape: false (a graph per shape, up to the recompile "
                            "limit), default (automatic dynamic after the first recompile), true, or mark "
                            "(mark_dynamic on the sequence axis); JAX compiles a program per shape",
                            cfg.COMPILE_DYNAMIC),
        "cudnn_benchmark": ("torch.backends.cudnn.benchmark", None),
        "xla_flags": ("XLA_FLAGS the JAX side adds before its backend starts, e.g. '--xla_cpu_use_onednn=true' "
                      "(torch: no effect)", None),
        "channels_last": ("torch memory format NHWC", None),
    },
    "loader": {
        "workers": ("loader worker processes (DataLoader / grain)", None),
        "prefetch": ("batches buffered per worker", None),
        "pin_mem": ("torch pinned host memory", None),
        "persistent_workers": ("keep workers between epochs", None),
        "device_prefetch": ("JAX: batches already transferred to the device", None),
        "drop_last": ("drop the short last training batch (one shape: no recompilation)", None),
        "read_latency_ms": ("simulated slow storage: ms of waiting per training batch read", None),
    },
    "parallel": {
        "devices": ("data-parallel replicas (batch_size each)", None),
        "processes": ("JAX processes the devices are spread over (jax.distributed)", None),
        "jax_parallel": ("JAX data-parallel engine", cfg.JAX_PARALLEL),
        "sync_bn": ("BatchNorm statistics over the global batch", None),
        "pipeline_stages": ("pipeline-parallel stages (1 or 2)", None),
        "pipeline_micro_batches": ("GPipe micro-batches per step", None),
    },
    "checkpointing": {
        "remat": ("activation checkpointing: none, all, or ResNet stages like 2,3; a transformer also takes "
                  "attention (every block's attention) or block numbers like 1,2", None),
        "remat_policy": ("JAX checkpoint policy name (jax.checkpoint_policies), e.g. "
                         "dots_with_no_batch_dims_saveable: keep the projections, recompute the attention scores",
                         None),
        "checkpoint_dir": ("folder of training-state checkpoints", None),
        "checkpoint_every": ("optimizer steps between checkpoints; 0: none", None),
        "resume": ("continue from the latest checkpoint in checkpoint_dir", None),
        "init_weights": ("initial weights (torch-keyed .npz) shared by both frameworks", None),
        "save_weights": ("write the final weights (torch-keyed .npz) here", None),
    },
    "measurement": {
        "timing_warmup": ("steps left out of the steady-state statistics (the first compiles)", None),
        "profile_steps": ("trace the last N steps (torch.profiler / jax.profiler)", None),
        "profile_dir": ("folder of the profiler trace", None),
        "tensorboard_dir": ("write TensorBoard scalars here (a subfolder per framework): per step loss, LR, step "
                            "time, data wait (fp16: loss scale); per evaluation accuracy and loss", None),
    },
}
# Test hooks: accepted, never shown in --help.
HIDDEN = ("fail_after_step", "inject_inf_at_step")

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
    "remat": ("--grad-checkpointing", "--remat"),
    "target_accuracy": ("--to-accuracy", "--target-accuracy"),
}
# Value names in --help where the help text names the value (otherwise the field's name in capitals).
METAVARS: dict[str, str] = {"target_accuracy": "A"}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, grouped; defaults unset so a --config file's values stay."""
    parser.add_argument("--config", default=None, help="TOML file with RunConfig keys (flags override it)")
    by_name = {f.name: f for f in fields(RunConfig)}
    for title, members in GROUPS.items():
        group = parser.add_argument_group(title)
        for name, (text, choices) in members.items():
            if name == "model":
                choices = known_models()
            default = by_name[name].default
            shown = default is None or "default" in text  # None: unset; or the help states it in words
            _add(group, by_name[name], text if shown else f"{text} (default: {default})", choices)
    for name in HIDDEN:
        _add(parser, by_name[name], argparse.SUPPRESS, None)


def _add(parser: Any, f: Any, text: str, choices: tuple[str, ...] | None) -> None:
    flags = FLAG_ALIASES.get(f.name, ("--" + f.name.replace("_", "-"),))
    if f.type == "bool":
        parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        parser.add_argument(*flags, dest=f.name, default=None, type=_parser_for(f.type), choices=choices,
                            metavar=None if choices else METAVARS.get(f.name, f.name.upper()), help=text)


def _parser_for(type_text: str) -> Any:
    if type_text.startswith("int"):
        return _optional(int)
    if type_text.startswith("float"):
        return _optional(float) if "None" in type_text else float  # "none" unsets an optional one (a TOML value)
    return _optional(str)


def _optional(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _steps_or_epochs(given: dict[str, Any]) -> dict[str, Any]:
    """Giving one of steps and epochs unsets the other (RunConfig needs exactly one)."""
    if "steps" in given and "epochs" not in given:
        given["epochs"] = None
    if "epochs" in given and "steps" not in given:
        given["steps"] = None
    return given


def load_toml(path: str | Path) -> RunConfig:
    """A RunConfig from a TOML file; sections ([optimizer], [techniques], ...) are only grouping, so one key set in
    two places (two sections, or a section and the top level) is refused, naming both: neither would be sure to win."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a TOML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return RunConfig.from_dict(_steps_or_epochs(toml_values(path)))


def toml_values(path: Path) -> dict[str, Any]:
    """The RunConfig keys a TOML file sets (``load_toml``'s checks), by field name."""
    try:
        values = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); "
                          f"TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for place, key, value in _entries(values):
        name = key.replace("-", "_")
        if name in flat:
            raise ConfigError(f"config file {path} sets {name} twice: {where[name]} and {place}; keep one")
        flat[name], where[name] = value, place
    return flat


def _entries(values: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(where, key, value) of every key of a TOML file: at the top level, or in a section ([optimizer])."""
    entries = []
    for key, value in values.items():
        if isinstance(value, dict):
            entries += [(f"[{key}] {k}", k, v) for k, v in value.items()]
        else:
            entries.append((f"the top level's {key}", key, value))
    return entries


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    base = load_toml(args.config) if getattr(args, "config", None) else RunConfig()
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    merged = {**_steps_or_epochs(given), **overrides}
    return base.replace(**with_family_source(merged, base))


def given_keys(args: argparse.Namespace) -> set[str]:
    """The RunConfig fields the user set, by a flag or in the --config file (a command may default the others
    differently from RunConfig, as infer does for a text model's batching)."""
    flags = {f.name for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    config = getattr(args, "config", None)
    return flags | (set(toml_values(Path(config))) if config else set())


def with_family_source(changes: dict[str, Any], base: RunConfig) -> dict[str, Any]:
    """A text model reads the text source unless a source was given (an image source is the default of all
    others): ``--model text-tiny`` alone is a complete run."""
    model = changes.get("model", base.model)
    if "source" not in changes and workload_for(model).family == "text" and base.source not in cfg.TEXT_SOURCES:
        return {**changes, "source": "text"}
    return changes
