"""The single-device technique switches on the torch side; jax_impl/techniques.py mirrors them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from common.applicability import no_effect_notes
from common.config import RunConfig

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def apply_flags(config: RunConfig, device: torch.device) -> list[str]:
    """Sets matmul precision and cuDNN flags process-wide; returns notes on what has no effect here.

    ``highest`` also switches off cuDNN's TF32 convolutions (on by default in torch), so fp32 means fp32
    on both frameworks until the flags rung."""
    torch.set_float32_matmul_precision(config.matmul_precision)
    torch.backends.cuda.matmul.allow_tf32 = config.matmul_precision != "highest"
    torch.backends.cudnn.allow_tf32 = config.matmul_precision != "highest"
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    return no_effect_notes(config, "torch", device.type)  # the one table of both frameworks


# --compile-dynamic -> torch.compile's dynamic argument (mark: the default, plus mark_dynamic on every batch)
DYNAMIC = {"false": False, "default": None, "true": True, "mark": None}


def compiled(config: RunConfig, model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``model`` under torch.compile with the run's mode and shape handling; ``mark`` marks the sequence axis of a
    text batch dynamic before each call, so its first graph is already shape-generic (no recompile to learn it)."""
    forward = torch.compile(model, mode=config.torchcompile_mode, dynamic=DYNAMIC[config.compile_dynamic])
    if config.compile_dynamic != "mark":
        return forward

    def marked(inputs: torch.Tensor) -> torch.Tensor:
        if inputs.ndim == 2:  # tokens (batch, length): the length varies; images keep one shape
            torch._dynamo.mark_dynamic(inputs, 1)
        return forward(inputs)

    return marked


def compile_optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step`` under torch.compile (PyTorch's compiled-optimizer recipe), so a compiled run's whole update
    is compiled, as jax.jit of JAX's step is; the LR is a tensor (``make_optimizer``), so the scheduler's new value
    each step is new data, not a new graph. GradScaler's ``step`` calls it too."""
    eager_step = optimizer.step

    @torch.compile(fullgraph=False)
    def step(*args, **kwargs):
        return eager_step(*args, **kwargs)

    optimizer.step = step  # type: ignore[method-assign]


def compiles_update(config: RunConfig) -> bool:
    """Whether the run compiles its optimizer's update too (--compile compiled with --compile-scope step)."""
    return config.compile == "compiled" and config.compile_scope == "step"


def param_dtype(config: RunConfig) -> torch.dtype:
    return torch.float64 if config.precision == "fp64" else torch.float32


def autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch autocast for bf16/fp16; the loss is computed on fp32 logits outside the cast ops."""
    if config.precision in ("fp32", "fp64"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[config.precision])


def make_grad_scaler(config: RunConfig, device: torch.device) -> torch.amp.GradScaler:
    """GradScaler belongs to fp16 only (bf16 has fp32's exponent range): disabled otherwise."""
    return torch.amp.GradScaler(device.type, init_scale=config.loss_scale_init,
                                growth_interval=config.loss_scale_growth_interval,
                                enabled=config.precision == "fp16")


@contextlib.contextmanager
def count_saved_bytes() -> Iterator[list[int]]:
    """Bytes autograd saves for the backward pass while the block runs (what checkpointing reduces)."""
    total = [0]
    seen: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else id(tensor)
        if key not in seen:  # several ops may save views of one storage
            seen.add(key)
            total[0] += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


# dynamo's timers: a frame's compilation (its forward graph, AOTAutograd's forward and inductor's code) and the
# backward graph, which AOTAutograd compiles at the first backward through it
COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process (measured: 14.9 s of timers against 14.9 s of
    wall time over four shapes of a small model here)."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_TIMERS))


def recompile_limit_hits() -> int:
    """Times dynamo gave up recompiling a frame in this process (its recompile limit)."""
    from torch._dynamo.utils import counters

    return sum(count for reason, count in counters["unimplemented"].items() if "recompile limit" in reason.lower())


def recompile_limit_notes(hits: int) -> list[str]:
    """``hits`` frames that reached dynamo's recompile limit: from then on new shapes run that frame eagerly, which
    is where the article's "it suddenly stalls" ends; said in the run, never hidden."""
    import torch._dynamo

    if not hits:
        return []
    limit = torch._dynamo.config.recompile_limit
    return [f"torch.compile hit its recompile limit ({limit} graphs a frame) {hits} time(s): later new shapes ran "
            f"that frame eagerly (torch._dynamo.config.recompile_limit)"]


def compile_counter() -> int:
    """Graphs torch.compile has compiled in this process (a recompilation adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
