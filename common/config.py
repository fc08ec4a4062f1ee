"""RunConfig: one description of a run that both trainers read, validated here with named errors.

Its flags and TOML files are experiments/cli.py; the LR formula is common/schedule.py; which model family, data and
loss a run uses is common/workloads.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from common.arch import NORMS, STEMS
from common.arch_vit import ATTENTION_KERNELS, POOLS
from common.data.sources import KNOWN_SOURCES
from common.data.text import BATCHINGS, parse_buckets
from common.errors import ConfigError
from common.workloads import known_models, workload_for

# fp64 is a verification mode, not a speed technique: it proves both trainers take the same steps,
# free of fp32's rounding noise floor (which makes even one framework diverge from itself).
PRECISIONS = ("fp32", "bf16", "fp16", "fp64")
COMPILE_MODES = ("eager", "compiled")
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZERS = ("sgd", "adamw")
JAX_PARALLEL = ("sharding", "shard_map", "pmap")
PIPELINE_SPLIT_STAGE = 3  # stem + layer1..2 | layer3..4 + classifier
# torch.compile's handling of a new input shape: false = one graph per shape (recompiles up to its limit, then
# eager), default = torch's own (static first, automatic dynamic from the first recompile), true = dynamic from the
# start, mark = torch._dynamo.mark_dynamic on the sequence axis of every batch. JAX has one answer: a program a shape.
COMPILE_DYNAMIC = ("false", "default", "true", "mark")
TEXT_SOURCES = ("text",)  # a folder of AG News CSVs or JSON Lines (common/data/text.py)
# twinrun infer's variants, in both frameworks (one that cannot run somewhere is skipped with its reason)
INFERENCE_VARIANTS = ("eager", "compiled", "folded", "int8", "int4", "onnxruntime", "tensorrt")
SCHEDULES = ("cosine", "constant")
# One XLA flag as XLA_FLAGS takes it: --xla_name=value or --xla_name (a boolean switch); flags are space-separated
XLA_FLAG = re.compile(r"--xla_[A-Za-z0-9_]+(=\S+)?")
# old field name -> new one: configs stored in earlier result rows and TOML files still read
RENAMED = {"grad_checkpointing": "remat", "checkpoint_policy": "remat_policy"}


@dataclass(frozen=True)
class RunConfig:
    # model
    model: str = "resnet18"
    stem: str = "cifar"
    width: float = 0.25
    norm: str = "batch"
    zero_init_residual: bool = False
    pool: str = "cls"  # transformers: classify from the class token, or the mean of the tokens
    # transformers: naive = softmax(QK^T/sqrt(d))V written out; fused = F.scaled_dot_product_attention /
    # jax.nn.dot_product_attention (the kernel that ran is in the run's notes)
    attention: str = "fused"
    max_len: int = 256  # text: tokens kept of a text, its [CLS] included (the position table's length)
    # data
    source: str = "cifar100"
    data: str | None = None
    png: bool = False
    synthetic_size: int = 2048
    image_size: int = 32
    # text: the padded length of a batch (common/data/text.py): pad-max (the split's longest text), pad-longest (the
    # batch's longest), bucket (the smallest bucket size that holds the batch's longest)
    batching: str = "pad-longest"
    buckets: str = "pow2"  # the bucket sizes: powers of two up to max_len, or a number N for its multiples
    # schedule of the run
    batch_size: int = 128
    steps: int | None = None
    epochs: int | None = 1
    eval_every: int = 0  # optimizer steps between evaluations; 0: only at the end
    eval_batches: int | None = None  # cap on evaluation batches (None: the whole split)
    # time to accuracy: stop at the first evaluation whose accuracy reaches this, evaluating at every epoch end
    # (besides eval_every); steps / epochs stay the most the run may take
    target_accuracy: float | None = None
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
    compile_dynamic: str = "default"  # text: torch.compile and a new sequence length (COMPILE_DYNAMIC above)
    matmul_precision: str = "highest"
    cudnn_benchmark: bool = False
    # XLA_FLAGS the JAX side adds before its backend starts (XLA:CPU's switches: oneDNN, XNNPACK fusion, ...);
    # torch accepts it with a note. The flags rung sets JAX_CPU_XLA_FLAGS (experiments/catalog/rungs.py) on a CPU.
    xla_flags: str = ""
    grad_accum_steps: int = 1
    lr_scale_accum: bool = False  # linear scaling rule: lr * grad_accum_steps
    # activation (gradient) checkpointing, called remat here so that "checkpoint" means only the saved training
    # state below; the flag keeps timm's name, --grad-checkpointing
    remat: str = "none"  # none | all | stages like "2,3"
    remat_policy: str = "nothing_saveable"
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
    # checkpoints of the training state (model, optimizer, schedule, scaler), for resuming
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    # profiler: the last ``profile_steps`` steps run under torch.profiler / jax.profiler (kept out of the
    # timing statistics, since tracing slows them) and write a trace under ``profile_dir``
    profile_steps: int = 0
    profile_dir: str | None = None
    # TensorBoard event files of the per-step scalars (loss, LR, step time) and evaluations, one subfolder per
    # framework; written between steps, outside their timed part
    tensorboard_dir: str | None = None
    # initial weights (torch-keyed .npz) shared by both frameworks for paired runs
    init_weights: str | None = None
    save_weights: str | None = None  # final weights (torch-keyed .npz, BN statistics included), e.g. for inference
    # test hooks: exit abruptly after this optimizer step (simulates a killed process); inject an inf
    fail_after_step: int | None = None
    inject_inf_at_step: int | None = None

    def __post_init__(self) -> None:
        _one_of("model", self.model, known_models())
        _one_of("stem", self.stem, STEMS)
        _one_of("norm", self.norm, NORMS)
        _one_of("pool", self.pool, POOLS)
        _one_of("attention", self.attention, ATTENTION_KERNELS)
        _one_of("source", self.source, KNOWN_SOURCES + TEXT_SOURCES)
        _one_of("batching", self.batching, BATCHINGS)
        _one_of("compile_dynamic", self.compile_dynamic, COMPILE_DYNAMIC)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("compile", self.compile, COMPILE_MODES)
        _one_of("torchcompile_mode", self.torchcompile_mode, TORCH_COMPILE_MODES)
        _one_of("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("jax_parallel", self.jax_parallel, JAX_PARALLEL)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        self._check_xla_flags()
        if self.source == "synthetic" and self.data is not None:
            raise ConfigError("--data is read by the CIFAR sources; source synthetic generates its images and would "
                              "ignore it")
        for name in ("batch_size", "devices", "processes", "grad_accum_steps", "image_size", "synthetic_size",
                     "prefetch", "loss_scale_growth_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("workers", "device_prefetch", "read_latency_ms", "warmup_steps", "eval_every", "timing_warmup",
                     "checkpoint_every", "seed", "min_lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.source == "synthetic" and self.batch_size * self.devices > self.synthetic_size:
            raise ConfigError(f"batch_size {self.batch_size} x devices {self.devices} is more than the "
                              f"{self.synthetic_size} images of the synthetic source (synthetic_size): a batch cannot "
                              f"hold more examples than the data set")
        if (self.steps is None) == (self.epochs is None):
            raise ConfigError("give exactly one of steps and epochs")
        for name in ("steps", "epochs", "eval_batches"):  # None: not given (the other of steps and epochs; all batches)
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:  # NaN fails this too
            raise ConfigError(f"target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.target_accuracy is not None and self.source == "synthetic":
            raise ConfigError("target_accuracy needs real labels; the synthetic source's accuracy means nothing")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0 < self.width <= 8:
            raise ConfigError(f"width must be in (0, 8], got {self.width}")
        if self.loss_scale_init <= 0:
            raise ConfigError(f"loss_scale_init must be positive, got {self.loss_scale_init}")
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
            raise ConfigError(f"devices ({self.devices}) must be a multiple of processes ({self.processes}): each "
                              f"process "
                              f"drives the same number of devices")
        if self.processes > 1 and self.jax_parallel == "pmap":
            raise ConfigError("pmap across processes is not supported here (pmap is in maintenance mode); use "
                              "jax_parallel "
                              "sharding or shard_map with processes > 1")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume needs checkpoint_dir")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError("checkpoint_every needs checkpoint_dir")
        _ = self.remat_plan  # validates the remat text
        self._check_text()

    def _check_xla_flags(self) -> None:
        """XLA_FLAGS of the JAX side, checked for their form now: XLA aborts the process on one it cannot parse."""
        bad = [flag for flag in self.xla_flags.split() if not XLA_FLAG.fullmatch(flag)]
        if bad:
            raise ConfigError(f"xla_flags: {bad[0]!r} is not an XLA flag; give flags like --xla_name=value or "
                              f"--xla_name, separated by spaces (e.g. --xla_cpu_use_onednn=true)")

    def _check_text(self) -> None:
        """A text model reads a text source and an image model an image source; the text knobs are validated."""
        text_model = workload_for(self.model).family == "text"
        if text_model != (self.source in TEXT_SOURCES):
            wanted = "source text (--source text --data FOLDER)" if text_model else "an image source"
            raise ConfigError(f"model '{self.model}' reads {wanted}; source is '{self.source}'")
        if self.max_len < 2:
            raise ConfigError(f"max_len must hold [CLS] and one byte at least, got {self.max_len}")
        parse_buckets(self.buckets, self.max_len)  # a clear error for bad bucket text

    def _check_pipeline(self) -> None:
        """What the 2-stage pipeline does not combine with, each named (it is built on its own, GPipe only)."""
        if not workload_for(self.model).pipeline:
            raise ConfigError(f"pipeline_stages=2 cuts a ResNet between its stages; model '{self.model}' has no such "
                              f"cut here (use data parallelism)")
        m = self.pipeline_micro_batches
        if m <= 0 or self.batch_size % m:
            raise ConfigError(f"pipeline_micro_batches ({m}) must be positive and divide batch_size "
                              f"({self.batch_size})")
        clashes = {"devices > 1 (pipeline and data parallel together are not built)": self.devices > 1,
                   "grad_accum_steps > 1 (the micro-batches are the pipeline's own)": self.grad_accum_steps > 1,
                   "remat (grad_checkpointing)": bool(self.remat_plan),
                   "precision fp16 (no loss scaler across stages)": self.precision == "fp16",
                   "checkpoint_every / resume (each process holds only its stage's optimizer state)":
                       bool(self.checkpoint_every or self.resume),
                   "profile_steps": self.profile_steps > 0}
        named = [name for name, clash in clashes.items() if clash]
        if named:
            raise ConfigError(f"pipeline_stages=2 does not combine with {', '.join(named)}")

    @property
    def remat_plan(self) -> Any:
        """What the model recomputes in the backward pass, in its family's terms (common/workloads.py): ResNet
        stages, or a transformer's RematPlan (blocks whole, attention only)."""
        return workload_for(self.model).remat(self)

    @property
    def remat_stages(self) -> tuple[int, ...]:
        """The ResNet stages (1..4) whose activations are recomputed in the backward pass."""
        text = self.remat.strip().lower()
        if text in ("none", ""):
            return ()
        if text == "all":
            return (1, 2, 3, 4)
        try:
            stages = tuple(sorted({int(s) for s in text.replace("stages:", "").split(",")}))
        except ValueError:
            raise ConfigError(f"grad_checkpointing (remat) must be none, all or stage numbers like '2,3'; "
                              f"got '{self.remat}'") from None
        if not stages or min(stages) < 1 or max(stages) > 4:
            raise ConfigError(f"grad_checkpointing (remat) stages must be within 1..4, got '{self.remat}'")
        return stages

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


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} '{value}'; known: {', '.join(allowed)}")
