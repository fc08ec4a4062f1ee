"""The sweeps: one technique's knob over several values, everything else at the preset's baseline."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.config import RunConfig
from common.errors import ConfigError
from common.workloads import WORKLOADS, workload_for

# How each framework is normally run (``--compile native``): op-by-op JAX is dispatch-bound and hides every technique.
NATIVE_MODES = {"torch": "eager", "jax": "compiled"}
COMPILE_OPTIONS = ("native", "eager", "compiled")


@dataclass(frozen=True)
class Sweep:
    name: str
    knob: str  # what is varied, for the report
    default_values: Callable[[RunConfig, bool], list[str]]  # (base config, CUDA present) -> values
    # (value, base, framework) -> config changes; None: the value has no meaning in that framework
    overrides: Callable[[str, RunConfig, str], dict[str, Any] | None]
    # a run's config -> extra row fields known before it runs (the shapes sweep: the epoch's padding, framework-free)
    row_fields: Callable[[RunConfig], dict[str, Any]] | None = None
    # base config -> the value every other is compared with (and the A/A control repeats): the preset's own
    reference: Callable[[RunConfig], str] | None = None


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError("not a whole number") from None


def _workers(value: str, base: RunConfig, framework: str) -> dict[str, Any]:
    workers = _int(value)
    return {"workers": workers, "persistent_workers": workers > 0, "prefetch": 4 if workers else 2}


def _accumulation(value: str, base: RunConfig, framework: str) -> dict[str, Any]:
    # The effective batch stays the preset's: k micro-batches of B/k (memory per micro-batch falls, the
    # update is the same one as a B batch, so the LR is not rescaled).
    k = _int(value)
    if k <= 0:
        raise ConfigError(f"k must be a positive divisor of the batch size {base.batch_size}")
    if base.batch_size % k:
        raise ConfigError(f"k={k} does not divide the batch size {base.batch_size}")
    return {"grad_accum_steps": k, "batch_size": base.batch_size // k}


def _compile_mode(value: str, base: RunConfig, framework: str) -> dict[str, Any] | None:
    if value == "eager":
        return {"compile": "eager"}
    if framework == "jax":  # jax.jit has no modes: run it once, under "default"
        return {"compile": "compiled"} if value == "default" else None
    return {"compile": "compiled", "torchcompile_mode": value}


# XLA:CPU switches measured for the flags rung (jaxlib 0.10.2 accepts each; README, "JAX's flags on a CPU")
XLA_CPU_CANDIDATES = ("default", "--xla_cpu_use_onednn=true",
                      "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
                      "--xla_cpu_enable_fast_math=true")


def _xla_flags(value: str, base: RunConfig, framework: str) -> dict[str, Any] | None:
    if framework != "jax":
        return None
    return {"xla_flags": "" if value == "default" else value}


def _workers_values(base: RunConfig, cuda: bool) -> list[str]:
    most = min(os.cpu_count() or 2, 8)
    return [str(w) for w in sorted({0, 1, 2, 4, 8} | {most}) if w <= most]


def _batch_size_values(base: RunConfig, cuda: bool) -> list[str]:
    return [str(base.batch_size // 2), str(base.batch_size), str(base.batch_size * 2)]


def _compile_mode_values(base: RunConfig, cuda: bool) -> list[str]:
    return ["eager", "default", "reduce-overhead", "max-autotune"] if cuda else ["eager", "default"]


def _remat_values(base: RunConfig, cuda: bool) -> list[str]:
    """The model family's own choices (common/workloads.py): ResNet stages, or a transformer's attention and blocks."""
    return list(workload_for(base.model).remat_choices(base))


def _attention(value: str, base: RunConfig, framework: str) -> dict[str, Any]:
    """--attention, refused by the model's name where its family has no attention (it would change nothing, and two
    identical runs would read as a measured difference)."""
    if not workload_for(base.model).attention:
        having = [m for w in WORKLOADS.values() if w.attention for m in w.models]
        raise ConfigError(f"model '{base.model}' has no attention, so the attention kernel changes nothing in it; "
                          f"sweep a model that has: {', '.join(having)} (--model)")
    return {"attention": value}


# The shapes sweep: "<batching>[:<torch.compile dynamic>]"; every run compiled (jax.jit, torch.compile) over one
# whole epoch, so its recompiles, compile seconds and end-to-end time are the epoch's. "eager": torch uncompiled,
# pad-longest, the reference a compiled strategy has to beat (JAX un-jitted is no strategy anyone runs).
SHAPE_VALUES = ("eager", "pad-max", "pad-longest:false", "pad-longest", "pad-longest:true", "pad-longest:mark",
                "bucket")


def _shapes(value: str, base: RunConfig, framework: str) -> dict[str, Any] | None:
    if workload_for(base.model).family != "text":
        texts = [m for w in WORKLOADS.values() if w.family == "text" for m in w.models]
        raise ConfigError(f"model '{base.model}' takes inputs of one shape; the shapes sweep needs a text model: "
                          f"{', '.join(texts)} (--model)")
    epoch = {"steps": None, "epochs": 1, "eval_batches": 1}
    if value == "eager":
        return {**epoch, "batching": "pad-longest"} if framework == "torch" else None
    batching, _, dynamic = value.partition(":")
    if batching not in ("pad-max", "pad-longest", "bucket"):
        raise ConfigError("expected pad-max, pad-longest or bucket, optionally :false, :default, :true or :mark "
                          "(torch.compile's dynamic), or eager")
    if dynamic and framework == "jax":
        return None  # jax.jit has one way: a program per shape
    return {**epoch, "batching": batching, "compile": "compiled", "compile_dynamic": dynamic or "default"}


def _shape_fields(config: RunConfig) -> dict[str, Any]:
    """The epoch's padding as the shared collator makes it: distinct padded lengths, real and padded tokens."""
    from common.data.batches import loader_sampler
    from common.data.text import epoch_shapes, load_text_source, parse_buckets
    from common.workloads import loader_options

    source = load_text_source(config.data, "train", max_len=config.max_len)  # type: ignore[arg-type]
    batches = loader_sampler(source, loader_options(config, train=True), train=True).batches(0)
    stats = epoch_shapes(source, batches, config.batching, parse_buckets(config.buckets, source.longest),
                         source.longest)  # the loaders' own choice (common.data.batches.make_batch_maker)
    return {"padded_lengths": list(stats.lengths_seen), "real_tokens": stats.real_tokens,
            "padded_tokens": stats.padded_tokens, "padding_waste": stats.waste}


def _fixed(*values: str) -> Callable[[RunConfig, bool], list[str]]:
    return lambda base, cuda: list(values)


def _setting(name: str, parse: Callable[[str], Any] = str) -> Callable[[str, RunConfig, str], dict[str, Any]]:
    return lambda value, base, framework: {name: parse(value)}


SWEEPS: dict[str, Sweep] = {s.name: s for s in (
    Sweep("workers", "loader workers (persistent, prefetch 4)", _workers_values, _workers,
          reference=lambda base: str(base.workers)),
    Sweep("batch-size", "batch size (LR unchanged)", _batch_size_values, _setting("batch_size", _int),
          reference=lambda base: str(base.batch_size)),
    Sweep("accumulation", "gradient accumulation k at a fixed effective batch (micro-batch = B/k)",
          _fixed("1", "2", "4"), _accumulation, reference=lambda base: "1"),
    Sweep("checkpointing", "gradient checkpointing (activations recomputed in backward): none / ResNet stages or a "
          "transformer's attention, blocks / all", _remat_values, _setting("remat"),
          reference=lambda base: "none"),
    Sweep("attention", "attention kernel: naive (softmax(QK^T/sqrt(d))V written out) / fused "
          "(F.scaled_dot_product_attention, jax.nn.dot_product_attention)", _fixed("naive", "fused"), _attention,
          reference=lambda base: base.attention),
    Sweep("precision", "compute precision (fp16 with loss scaling; params, BN statistics and loss fp32)",
          _fixed("fp32", "bf16", "fp16"), _setting("precision"),
          reference=lambda base: "fp32"),
    Sweep("scaling", "data-parallel replicas at a fixed per-replica batch (torch DDP processes; JAX devices, "
          "host devices on a CPU): the global batch grows with them", _fixed("1", "2", "4"), _setting("devices", _int),
          reference=lambda base: "1"),
    Sweep("pipeline", "pipeline stages at a fixed batch (2: GPipe over pipeline_micro_batches; torch processes, "
          "JAX devices, host devices on a CPU)", _fixed("1", "2"), _setting("pipeline_stages", _int),
          reference=lambda base: "1"),
    Sweep("shapes", "variable-length text: batching (pad to the split's longest, the batch's longest, buckets) x "
          "torch.compile dynamic (false / default / true / mark_dynamic); JAX jit compiles a program per shape; one "
          "epoch each", _fixed(*SHAPE_VALUES), _shapes, row_fields=_shape_fields,
          reference=lambda base: "pad-max"),
    Sweep("compile-mode", "torch.compile mode (JAX: jax.jit, which has no modes)", _compile_mode_values,
          _compile_mode, reference=lambda base: "eager"),
    Sweep("compile-scope", "what compilation covers, in both frameworks: eager / the model (forward and backward; the "
          "update op by op) / the whole step (the optimizer's update too)", _fixed("eager", "model", "step"),
          lambda value, base, framework: {"compile": "eager"} if value == "eager" else
          {"compile": "compiled", "compile_scope": value}, reference=lambda base: "eager"),
    Sweep("xla-flags", "XLA_FLAGS of the JAX side (XLA:CPU switches; 'default': none); torch is not run",
          lambda base, cuda: list(XLA_CPU_CANDIDATES), _xla_flags,
          reference=lambda base: "default"),
)}


def reference_value(sweep: Sweep, values: list[str], base: RunConfig) -> str:
    """The value a sweep's others are compared with in one framework: the preset's own setting (``reference``),
    or the first value that framework runs when it does not run that one (or the sweep names none)."""
    wanted = sweep.reference(base) if sweep.reference is not None else None
    return wanted if wanted in values else values[0]


def mode_for(compile_option: str, framework: str) -> str:
    """The compile mode of ``framework`` under ``--compile``: native is how each framework is normally run."""
    if compile_option == "native":
        return NATIVE_MODES[framework]
    return compile_option


def checked_values(sweep: Sweep, values: list[str], base: RunConfig, frameworks: tuple[str, ...]) -> list[str]:
    """The values, stripped, each applied once to ``base``: a bad value fails here, before any run, as a
    ConfigError naming the sweep and the value (whatever the error applying it was)."""
    values = [v.strip() for v in values if v.strip()]
    for value in values:
        for framework in frameworks:
            try:
                changes = sweep.overrides(value, base, framework)
                if changes is not None:
                    base.replace(**changes)
            except ConfigError as exc:
                raise ConfigError(f"{sweep.name} value '{value}': {exc}") from None
            except Exception as exc:  # a value no check foresaw: still named, never a traceback
                raise ConfigError(f"{sweep.name} value '{value}': {type(exc).__name__}: {exc}") from None
    return values
