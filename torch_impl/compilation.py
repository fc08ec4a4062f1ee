"""torch.compile on the torch side: what it compiles (the model, the optimizer's update) and what it reports (graphs,
seconds, the recompile limit reached); jax_impl/compilation.py counts jit's programs the same way."""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.config import RunConfig

# --compile-dynamic -> torch.compile's dynamic argument (mark: the default, plus mark_dynamic on every batch)
DYNAMIC = {"false": False, "default": None, "true": True, "mark": None}


def compile_options(config: RunConfig) -> dict[str, str]:
    """torch.compile's backend and mode as the run asks (a mode is inductor's: another backend takes none)."""
    if config.torchcompile_backend == "inductor":
        return {"backend": "inductor", "mode": config.torchcompile_mode}
    return {"backend": config.torchcompile_backend}


def backend_notes(config: RunConfig) -> list[str]:
    """A compiled run's note when its backend generates no code: its graphs and recompiles are a compiled run's, its
    step times are not (said in its row, so a report never reads them as inductor's)."""
    if config.compile != "compiled" or config.torchcompile_backend == "inductor":
        return []
    return [f"torch.compile backend {config.torchcompile_backend}: dynamo's graphs run with eager kernels, no "
            f"generated code (its graphs and recompiles are a compiled run's, its step times are not)"]


def compiled(config: RunConfig, model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``model`` under torch.compile with the run's backend, mode and shape handling; ``mark`` marks the sequence axis
    of a text batch dynamic before each call, so its first graph is already shape-generic (no recompile to learn it)."""
    forward = torch.compile(model, dynamic=DYNAMIC[config.compile_dynamic], **compile_options(config))
    if config.compile_dynamic != "mark":
        return forward

    def marked(inputs: torch.Tensor) -> torch.Tensor:
        if inputs.ndim == 2:  # tokens (batch, length): the length varies; images keep one shape
            torch._dynamo.mark_dynamic(inputs, 1)
        return forward(inputs)

    return marked


def compile_optimizer_step(optimizer: torch.optim.Optimizer, backend: str = "inductor") -> None:
    """``optimizer.step`` under torch.compile (PyTorch's compiled-optimizer recipe), so a compiled run's whole update
    is compiled, as jax.jit of JAX's step is; the LR is a tensor (``make_optimizer``), so the scheduler's new value
    each step is new data, not a new graph. GradScaler's ``step`` calls it too."""
    eager_step = optimizer.step

    @torch.compile(fullgraph=False, backend=backend)
    def step(*args, **kwargs):
        return eager_step(*args, **kwargs)

    optimizer.step = step  # type: ignore[method-assign]


def compiles_update(config: RunConfig) -> bool:
    """Whether the run compiles its optimizer's update too (--compile compiled with --compile-scope step)."""
    return config.compile == "compiled" and config.compile_scope == "step"


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


def compile_count() -> int:
    """Graphs torch.compile has compiled in this process (a recompilation adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
