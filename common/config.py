"""RunConfig: one description of a run that both trainers read, validated here with named errors.

Each field is written once, with ``knob``: its default, its help, its flag group, its choices or bounds, and the
frameworks it applies to. The flags (experiments/cli.py) are built from that; so is the validation: every field
checked against its own declaration, then the few rules that tie fields together (``CROSS_CHECKS``, each a small
named function). The LR formula is common/schedule.py; which model family, data and loss a run uses is
common/workloads.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from common.arch import NORMS, STEMS
from common.arch_encoder import ATTENTION_KERNELS, POOLS
from common.data.sources import KNOWN_SOURCES
from common.data.text import BATCHINGS, parse_buckets
from common.errors import ConfigError
from common.workloads import known_models, workload_for

# fp64 is a verification mode, not a speed technique: it proves both trainers take the same steps,
# free of fp32's rounding noise floor (which makes even one framework diverge from itself).
PRECISIONS = ("fp32", "bf16", "fp16", "fp64")
COMPILE_MODES = ("eager", "compiled")
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# torch.compile's backend (the names timm's --torchcompile takes): inductor generates kernels; aot_eager traces the
# graphs and splits forward from backward as inductor's input is made, then runs them with eager kernels (PyTorch's
# step for telling a graph-capture problem from a code-generation one); eager runs dynamo's captured graphs as they
# are (no AOTAutograd: the backward's compile timer records nothing, so its compile seconds read lower)
TORCH_COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZERS = ("sgd", "adamw")
JAX_PARALLEL = ("sharding", "shard_map", "pmap")
PIPELINE_SPLIT_STAGE = 3  # stem + layer1..2 | layer3..4 + classifier
# torch.compile's handling of a new input shape: false = one graph per shape (recompiles up to its limit, then
# eager), default = torch's own (static first, automatic dynamic from the first recompile), true = dynamic from the
# start, mark = torch._dynamo.mark_dynamic on the sequence axis of every batch. JAX has one answer: a program a shape.
COMPILE_DYNAMIC = ("false", "default", "true", "mark")
# What --compile compiled covers (common/config.py's compile_scope): the whole update (forward, backward and the
# optimizer: jax.jit of the step; torch.compile of the model and of optimizer.step, PyTorch's compiled-optimizer
# recipe) or the model alone (forward and backward; the optimizer's update runs op by op on both sides)
COMPILE_SCOPES = ("step", "model")
TEXT_SOURCES = ("text",)  # a folder of AG News CSVs or JSON Lines (common/data/text.py)
# twinrun infer's variants, in both frameworks (one that cannot run somewhere is skipped with its reason)
SCHEDULES = ("cosine", "constant")
# One XLA flag as XLA_FLAGS takes it: --xla_name=value or --xla_name (a boolean switch); flags are space-separated
XLA_FLAG = re.compile(r"--xla_[A-Za-z0-9_]+(=\S+)?")
# old field name -> new one: configs stored in earlier result rows and TOML files still read
RENAMED = {"grad_checkpointing": "remat", "checkpoint_policy": "remat_policy"}

# The flag groups, in --help's order; test hooks are accepted and never shown.
GROUPS = ("data", "model", "optimizer", "schedule of the run", "precision", "compile", "loader", "parallel",
          "checkpointing", "measurement")
TEST_HOOKS = "test hooks"
FRAMEWORKS = ("torch", "jax")


@dataclass(frozen=True)
class Bounds:
    """The interval a number must lie in; ``str`` is how an error names it ("positive", "in [0, 1)")."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    said: str = ""  # how errors name it instead, where the interval alone says too little

    def holds(self, value: float) -> bool:  # NaN holds nowhere
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.said:
            return self.said
        if self.high == math.inf:
            return "positive" if (self.low, self.low_open) == (0, True) else f"{self.low:g} or more"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


POSITIVE = Bounds(0, low_open=True)
AT_LEAST_0 = Bounds(0)


@dataclass(frozen=True)
class Knob:
    """What a RunConfig field says of itself besides its default."""

    help: str
    group: str  # one of GROUPS, or TEST_HOOKS
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None  # a callable: a registry's current names
    bounds: Bounds | None = None  # None is always allowed where the field's type allows it (not given)
    frameworks: tuple[str, ...] = FRAMEWORKS  # where it changes anything (elsewhere: accepted, with a note)
    flags: tuple[str, ...] = ()  # its spellings (timm's where it has one); none: --field-name
    metavar: str | None = None  # its value's name in --help, where the help names it

    @property
    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices


def knob(default: Any, help: str, group: str, *, choices: Any = None, bounds: Bounds | None = None,
         frameworks: tuple[str, ...] = FRAMEWORKS, flags: tuple[str, ...] = (), metavar: str | None = None) -> Any:
    """A RunConfig field with its declaration (``Knob``) as metadata."""
    return field(default=default, metadata={"knob": Knob(help, group, choices, bounds, frameworks, flags, metavar)})


def knob_of(f: dataclasses.Field) -> Knob:
    return f.metadata["knob"]


TORCH_ONLY, JAX_ONLY = ("torch",), ("jax",)


@dataclass(frozen=True)
class RunConfig:
    # data
    source: str = knob("cifar100", "data set (text: a folder of AG News train.csv/test.csv or train.jsonl/test.jsonl; "
                       "the default of a text model)", "data", choices=KNOWN_SOURCES + TEXT_SOURCES)
    data: str | None = knob(None, "CIFAR archive (.tar.gz) or extracted folder, or a text folder; default: a generated "
                            "one", "data", flags=("--data", "--data-dir"))
    png: bool = knob(False, "read the images as PNG files (the decode cost of a real image folder)", "data")
    synthetic_size: int = knob(2048, "images in the synthetic source", "data", bounds=POSITIVE)
    image_size: int = knob(32, "image side in pixels (synthetic source)", "data", bounds=POSITIVE)
    batching: str = knob("pad-longest", "text: pad each batch to the split's longest text (pad-max), to the batch's "
                         "longest (pad-longest) or to the smallest bucket that holds it (bucket)", "data",
                         choices=BATCHINGS)
    buckets: str = knob("pow2", "text: bucket sizes, pow2 (16, 32, 64 ... max_len) or N (multiples of N)", "data")
    # model
    model: str = knob("resnet18", "architecture, or a workload from outside the repository (module:NAME, "
                            "path/to/file.py:NAME)", "model", choices=known_models)
    stem: str = knob("cifar", "cifar: 3x3 conv; imagenet: 7x7 conv + max-pool", "model", choices=STEMS)
    width: float = knob(0.25, "channel multiplier of the ResNet (a ViT's width is its name's: vit-micro 64, vit-tiny "
                        "192, vit-s 384)", "model", bounds=Bounds(0, 8, low_open=True))
    norm: str = knob("batch", "normalisation layer", "model", choices=NORMS)
    zero_init_residual: bool = knob(False, "zero the last norm scale of every residual block", "model")
    pool: str = knob("cls", "transformer: classify from the class token or the mean of the tokens", "model",
                     choices=POOLS)
    attention: str = knob("fused", "transformer attention kernel: naive (softmax(QK^T/sqrt(d))V written out) or fused "
                          "(F.scaled_dot_product_attention / jax.nn.dot_product_attention)", "model",
                          choices=ATTENTION_KERNELS)
    max_len: int = knob(256, "text: tokens kept of each text ([CLS] + UTF-8 bytes), the position table's length",
                        "model", bounds=Bounds(2, said="2 or more ([CLS] and one byte at least)"))
    # optimizer
    optimizer: str = knob("sgd", "torch.optim formulas, mirrored in optax", "optimizer", choices=OPTIMIZERS)
    lr: float = knob(0.1, "base learning rate", "optimizer", bounds=POSITIVE)
    momentum: float = knob(0.9, "SGD momentum", "optimizer", bounds=Bounds(0, 1, high_open=True))
    weight_decay: float = knob(5e-4, "SGD: coupled; AdamW: decoupled", "optimizer", bounds=AT_LEAST_0,
                               flags=("--weight-decay", "--wd"))
    schedule: str = knob("cosine", "LR schedule after the warm-up", "optimizer", choices=SCHEDULES)
    warmup_steps: int = knob(0, "linear LR warm-up, in optimizer steps", "optimizer", bounds=AT_LEAST_0)
    min_lr: float = knob(0.0, "the cosine schedule's floor", "optimizer", bounds=AT_LEAST_0)
    label_smoothing: float = knob(0.0, "label smoothing of the cross-entropy", "optimizer",
                                  bounds=Bounds(0, 1, high_open=True), flags=("--smoothing", "--label-smoothing"))
    grad_accum_steps: int = knob(1, "micro-batches per optimizer step (gradient accumulation)", "optimizer",
                                 bounds=POSITIVE)
    lr_scale_accum: bool = knob(False, "linear scaling rule: lr x grad_accum_steps", "optimizer")
    seed: int = knob(0, "initialisation, shuffling and augmentation seed", "optimizer", bounds=AT_LEAST_0)
    # schedule of the run
    batch_size: int = knob(128, "images per step and replica (per micro-batch with accumulation)",
                           "schedule of the run", bounds=POSITIVE, flags=("-b", "--batch-size"))
    steps: int | None = knob(None, "optimizer steps (give steps or epochs)", "schedule of the run", bounds=POSITIVE)
    epochs: int | None = knob(1, "epochs (give steps or epochs)", "schedule of the run", bounds=POSITIVE)
    eval_every: int = knob(0, "optimizer steps between evaluations; 0: at the end only", "schedule of the run",
                           bounds=AT_LEAST_0)
    eval_batches: int | None = knob(None, "cap on evaluation batches; none: the whole test split",
                                    "schedule of the run", bounds=POSITIVE)
    # time to accuracy: steps / epochs stay the most the run may take
    target_accuracy: float | None = knob(None, "stop at the first evaluation whose accuracy reaches A; evaluates at "
                                         "every epoch end (and every --eval-every steps)", "schedule of the run",
                                         bounds=Bounds(0, 1, low_open=True), flags=("--to-accuracy",
                                                                                    "--target-accuracy"), metavar="A")
    # precision
    precision: str = knob("fp32", "compute dtype; fp64 is the verification mode", "precision", choices=PRECISIONS,
                          flags=("--amp-dtype", "--precision"))
    matmul_precision: str = knob("highest", "fp32 matmul precision (torch set_float32_matmul_precision / JAX "
                                 "default_matmul_precision)", "precision", choices=MATMUL_PRECISIONS)
    loss_scale_init: float = knob(2.0**16, "fp16: initial dynamic loss scale", "precision", bounds=POSITIVE)
    loss_scale_growth_interval: int = knob(2000, "fp16: steps without overflow before the scale doubles",
                                           "precision", bounds=POSITIVE)
    # compile
    compile: str = knob("eager", "torch.compile / jax.jit, or eager (JAX: op by op)", "compile",
                        choices=COMPILE_MODES)
    compile_scope: str = knob("step", "what --compile compiled covers, in both frameworks: step (forward, backward and "
                              "the optimizer's update, as jax.jit of the step) or model (forward and backward; the "
                              "update op by op, as torch.compile(model) alone)", "compile", choices=COMPILE_SCOPES)
    torchcompile_mode: str = knob("default", "torch.compile mode", "compile", choices=TORCH_COMPILE_MODES,
                                  frameworks=TORCH_ONLY)
    torchcompile_backend: str = knob("inductor", "torch.compile backend: inductor (generated kernels), aot_eager "
                                     "(graphs captured, forward and backward split, eager kernels: graph breaks and "
                                     "recompiles without inductor's compile time) or eager", "compile",
                                     choices=TORCH_COMPILE_BACKENDS, frameworks=TORCH_ONLY)
    compile_dynamic: str = knob("default", "torch.compile and a new input shape: false (a graph per shape, up to the "
                                "recompile limit), default (automatic dynamic after the first recompile), true, or "
                                "mark (mark_dynamic on the sequence axis); JAX compiles a program per shape",
                                "compile", choices=COMPILE_DYNAMIC, frameworks=TORCH_ONLY)
    cudnn_benchmark: bool = knob(False, "torch.backends.cudnn.benchmark", "compile", frameworks=TORCH_ONLY)
    # XLA:CPU's switches (oneDNN, XNNPACK fusion, ...); the flags rung sets JAX_CPU_XLA_FLAGS on a CPU
    # (experiments/catalog/rungs.py)
    xla_flags: str = knob("", "XLA_FLAGS added before the backend starts, e.g. '--xla_cpu_use_onednn=true'",
                          "compile", frameworks=JAX_ONLY)
    channels_last: bool = knob(False, "memory format NHWC", "compile", frameworks=TORCH_ONLY)
    # loader
    workers: int = knob(0, "loader worker processes (DataLoader / grain)", "loader", bounds=AT_LEAST_0,
                        flags=("-j", "--workers"))
    prefetch: int = knob(2, "batches buffered per worker", "loader", bounds=POSITIVE)
    pin_mem: bool = knob(False, "pinned host memory", "loader", frameworks=TORCH_ONLY)
    persistent_workers: bool = knob(False, "keep workers between epochs", "loader")
    device_prefetch: int = knob(0, "batches already transferred to the device", "loader", bounds=AT_LEAST_0,
                                frameworks=JAX_ONLY)
    drop_last: bool = knob(False, "drop the short last training batch (one shape: no recompilation)", "loader")
    read_latency_ms: float = knob(0.0, "simulated slow storage: ms of waiting per training batch read", "loader",
                                  bounds=AT_LEAST_0)
    # parallel. Data parallel: ``devices`` replicas of ``batch_size`` each; torch runs one DDP process per device
    # under torchrun, JAX one process over that many local devices (by ``jax_parallel``), or ``processes`` joined by
    # jax.distributed. Pipeline parallel: the ResNet cut before stage PIPELINE_SPLIT_STAGE into two stages on two
    # devices (torch.distributed.pipelining; JAX: shard_map + ppermute), GPipe over micro-batches.
    devices: int = knob(1, "data-parallel replicas (batch_size each)", "parallel", bounds=POSITIVE)
    processes: int = knob(1, "processes the devices are spread over (jax.distributed; torch runs a process per "
                          "device)", "parallel", bounds=POSITIVE, frameworks=JAX_ONLY)
    jax_parallel: str = knob("sharding", "data-parallel engine", "parallel", choices=JAX_PARALLEL, frameworks=JAX_ONLY)
    sync_bn: bool = knob(False, "BatchNorm statistics over the global batch", "parallel")
    pipeline_stages: int = knob(1, "pipeline-parallel stages (1 or 2)", "parallel", bounds=Bounds(1, 2, said="1 or 2"))
    pipeline_micro_batches: int = knob(4, "GPipe micro-batches per step", "parallel", bounds=POSITIVE)
    # checkpointing: activation checkpointing is called remat here, so that "checkpoint" means only the saved
    # training state (its flag keeps timm's name, --grad-checkpointing)
    remat: str = knob("none", "activation checkpointing: none, all, or ResNet stages like 2,3; a transformer also "
                      "takes attention (every block's attention) or block numbers like 1,2", "checkpointing",
                      flags=("--grad-checkpointing", "--remat"))
    remat_policy: str = knob("nothing_saveable", "checkpoint policy name (jax.checkpoint_policies), e.g. "
                             "dots_with_no_batch_dims_saveable: keep the projections, recompute the attention scores",
                             "checkpointing", frameworks=JAX_ONLY)
    checkpoint_dir: str | None = knob(None, "folder of training-state checkpoints", "checkpointing")
    checkpoint_every: int = knob(0, "optimizer steps between checkpoints; 0: none", "checkpointing",
                                 bounds=AT_LEAST_0)
    resume: bool = knob(False, "continue from the latest checkpoint in checkpoint_dir", "checkpointing")
    init_weights: str | None = knob(None, "initial weights (torch-keyed .npz) shared by both frameworks",
                                    "checkpointing")
    save_weights: str | None = knob(None, "write the final weights (torch-keyed .npz) here", "checkpointing")
    # measurement
    timing_warmup: int = knob(2, "steps left out of the steady-state statistics (the first compiles)", "measurement",
                              bounds=AT_LEAST_0)
    profile_steps: int = knob(0, "trace the last N steps (torch.profiler / jax.profiler)", "measurement",
                              bounds=AT_LEAST_0)
    profile_dir: str | None = knob(None, "folder of the profiler trace", "measurement")
    tensorboard_dir: str | None = knob(None, "write TensorBoard scalars here (a subfolder per framework): per step "
                                       "loss, LR, step time, data wait (fp16: loss scale); per evaluation accuracy "
                                       "and loss", "measurement")
    # test hooks
    fail_after_step: int | None = knob(None, "exit abruptly after this optimizer step (a killed process)", TEST_HOOKS)
    inject_inf_at_step: int | None = knob(None, "make this step's loss inf (the fp16 loss scaler's test)", TEST_HOOKS)

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        for check in CROSS_CHECKS:
            check(self)

    @property
    def remat_plan(self) -> Any:
        """What the model recomputes in the backward pass, in its family's terms (common/workloads.py): ResNet
        stages, or a transformer's RematPlan (blocks whole, attention only)."""
        return workload_for(self.model).remat(self)

    @property
    def effective_lr(self) -> float:
        """The linear scaling rule: k micro-batches make a k-times batch, so the base LR is scaled by k."""
        return self.lr * (self.grad_accum_steps if self.lr_scale_accum else 1)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        values = {RENAMED.get(k, k): v for k, v in values.items()}  # rows and files written before a rename
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
        types = {f.name: f.type for f in fields(cls)}
        return cls(**{key: _typed(key, value, types[key]) for key, value in values.items()})


def _check_field(f: dataclasses.Field, value: Any) -> None:
    """One field against its own declaration: one of its choices, a finite number, within its bounds."""
    declared = knob_of(f)
    allowed = declared.allowed
    if allowed is not None and value not in allowed:
        raise ConfigError(f"unknown {f.name} '{value}'; known: {', '.join(allowed)}")
    if f.type == "float" and not math.isfinite(value):
        raise ConfigError(f"{f.name} must be a finite number, got {value}")
    if declared.bounds is not None and value is not None and not declared.bounds.holds(value):
        raise ConfigError(f"{f.name} must be {declared.bounds}, got {value}")


# --- the rules that tie fields together, in the order they are checked ----------------------------------------------


def _steps_or_epochs(c: RunConfig) -> None:
    if (c.steps is None) == (c.epochs is None):
        raise ConfigError("give exactly one of steps and epochs")


def _xla_flags_parse(c: RunConfig) -> None:
    """XLA_FLAGS of the JAX side, checked for their form now: XLA aborts the process on one it cannot parse."""
    bad = [flag for flag in c.xla_flags.split() if not XLA_FLAG.fullmatch(flag)]
    if bad:
        raise ConfigError(f"xla_flags: {bad[0]!r} is not an XLA flag; give flags like --xla_name=value or "
                          f"--xla_name, separated by spaces (e.g. --xla_cpu_use_onednn=true)")


def _synthetic_data(c: RunConfig) -> None:
    """The synthetic source reads no file, fits a batch in its images, and has no accuracy to reach."""
    if c.source != "synthetic":
        return
    if c.data is not None:
        raise ConfigError("--data is read by the CIFAR sources; source synthetic generates its images and would "
                          "ignore it")
    if c.batch_size * c.devices > c.synthetic_size:
        raise ConfigError(f"batch_size {c.batch_size} x devices {c.devices} is more than the {c.synthetic_size} "
                          f"images of the synthetic source (synthetic_size): a batch cannot hold more examples than "
                          f"the data set")
    if c.target_accuracy is not None:
        raise ConfigError("target_accuracy needs real labels; the synthetic source's accuracy means nothing")


def _fp16_rules(c: RunConfig) -> None:
    if c.precision != "fp16" and c.inject_inf_at_step is not None:
        raise ConfigError("inject_inf_at_step tests the fp16 loss scaler; it needs precision fp16")
    if c.precision == "fp16" and c.grad_accum_steps > 1:
        raise ConfigError("fp16 with grad_accum_steps > 1 is not supported: skipping an overflowed step would have "
                          "to discard a whole accumulation window in optax.MultiSteps; use bf16 or k = 1")


def _profiler_window(c: RunConfig) -> None:
    if c.profile_steps and not c.profile_dir:
        raise ConfigError("profile_steps needs profile_dir")
    if c.steps is not None and c.profile_steps >= c.steps:
        raise ConfigError(f"profile_steps ({c.profile_steps}) must leave untraced steps of the {c.steps}")


def _sync_bn_needs_batchnorm(c: RunConfig) -> None:
    if c.sync_bn and c.norm != "batch":
        raise ConfigError(f"sync_bn synchronises BatchNorm statistics; norm is '{c.norm}'")


def _pipeline(c: RunConfig) -> None:
    """What the 2-stage pipeline does not combine with, each named (it is built on its own, GPipe only)."""
    if c.pipeline_stages == 1:
        return
    if not workload_for(c.model).pipeline:
        raise ConfigError(f"pipeline_stages=2 cuts a ResNet between its stages; model '{c.model}' has no such cut "
                          f"here (use data parallelism)")
    if c.batch_size % c.pipeline_micro_batches:
        raise ConfigError(f"pipeline_micro_batches ({c.pipeline_micro_batches}) must divide batch_size "
                          f"({c.batch_size})")
    clashes = {"devices > 1 (pipeline and data parallel together are not built)": c.devices > 1,
               "grad_accum_steps > 1 (the micro-batches are the pipeline's own)": c.grad_accum_steps > 1,
               "remat (grad_checkpointing)": bool(c.remat_plan),
               "precision fp16 (no loss scaler across stages)": c.precision == "fp16",
               "checkpoint_every / resume (each process holds only its stage's optimizer state)":
                   bool(c.checkpoint_every or c.resume),
               "profile_steps": c.profile_steps > 0}
    named = [name for name, clash in clashes.items() if clash]
    if named:
        raise ConfigError(f"pipeline_stages=2 does not combine with {', '.join(named)}")


def _processes(c: RunConfig) -> None:
    if c.devices % c.processes:
        raise ConfigError(f"devices ({c.devices}) must be a multiple of processes ({c.processes}): each process "
                          f"drives the same number of devices")
    if c.processes > 1 and c.jax_parallel == "pmap":
        raise ConfigError("pmap across processes is not supported here (pmap is in maintenance mode); use "
                          "jax_parallel sharding or shard_map with processes > 1")


def _checkpoints_need_a_folder(c: RunConfig) -> None:
    if c.resume and not c.checkpoint_dir:
        raise ConfigError("resume needs checkpoint_dir")
    if c.checkpoint_every and not c.checkpoint_dir:
        raise ConfigError("checkpoint_every needs checkpoint_dir")


def _mode_is_inductors(c: RunConfig) -> None:
    if c.torchcompile_backend != "inductor" and c.torchcompile_mode != "default":
        raise ConfigError(f"torchcompile_mode '{c.torchcompile_mode}' is an inductor mode; torchcompile_backend is "
                          f"'{c.torchcompile_backend}'")


def _remat_parses(c: RunConfig) -> None:
    _ = c.remat_plan  # the family's parser names what it cannot read


def _text_reads_text(c: RunConfig) -> None:
    """A text model reads a text source and an image model an image source; the bucket text parses."""
    text_model = workload_for(c.model).family == "text"
    if text_model != (c.source in TEXT_SOURCES):
        wanted = "source text (--source text --data FOLDER)" if text_model else "an image source"
        raise ConfigError(f"model '{c.model}' reads {wanted}; source is '{c.source}'")
    parse_buckets(c.buckets, c.max_len)


CROSS_CHECKS: tuple[Callable[[RunConfig], None], ...] = (
    _steps_or_epochs, _xla_flags_parse, _synthetic_data, _fp16_rules, _profiler_window, _sync_bn_needs_batchnorm,
    _pipeline, _processes, _checkpoints_need_a_folder, _mode_is_inductors, _remat_parses, _text_reads_text)


# annotation -> (test, what it asks for); bool is not an int here, an int is a fine float
_KINDS: dict[str, tuple[Any, str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "None": (lambda v: v is None, "none"),
}


def _typed(key: str, value: Any, annotation: str) -> Any:
    """``value`` checked against the field's annotation (a string: ``int``, ``str | None``, ...), as a
    ConfigError naming the key; an int given for a float field becomes a float."""
    kinds = [part.strip() for part in annotation.split("|")]
    for kind in kinds:
        test, _ = _KINDS[kind]
        if test(value):
            return float(value) if kind == "float" else value
    wanted = " or ".join(_KINDS[kind][1] for kind in kinds)
    raise ConfigError(f"config key {key} must be {wanted}, got {value!r} ({type(value).__name__})")
