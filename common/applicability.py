"""Where each setting changes anything, written once for both frameworks: the "no effect here" notes of a torch run
and of a JAX run both come from ``TABLE`` (``no_effect_notes``), so a setting one framework ignores is said to be
ignored in that framework's rows as in the other's, and a device that cannot use it is named in both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from common.config import RunConfig


@dataclass(frozen=True)
class Applicability:
    """One setting: when it counts as set, the frameworks where it means nothing (and why), the device platform it
    needs in a framework where it means something (and why not elsewhere), and whether it needs a compiled run."""

    field: str
    is_set: Callable[[RunConfig], bool]
    elsewhere: dict[str, str] = field(default_factory=dict)  # framework -> why the setting means nothing there
    needs: dict[str, tuple[str, str]] = field(default_factory=dict)  # framework -> (platform, why not on another)
    needs_compiled: bool = False


TABLE: tuple[Applicability, ...] = (
    Applicability("cudnn_benchmark", lambda c: c.cudnn_benchmark,
                  elsewhere={"jax": "a torch flag; XLA autotunes convolutions itself"},
                  needs={"torch": ("cuda", "no CUDA device")}),
    Applicability("matmul_precision", lambda c: c.matmul_precision != "highest",
                  needs={"torch": ("cuda", "no TF32 without a CUDA device"),
                         "jax": ("gpu", "XLA:CPU multiplies fp32 in fp32")}),
    Applicability("pin_mem", lambda c: c.pin_mem,
                  elsewhere={"jax": "a torch flag; the JAX analogue is device_prefetch"},
                  needs={"torch": ("cuda", "no CUDA device to copy to")}),
    Applicability("channels_last", lambda c: c.channels_last,
                  elsewhere={"jax": "a torch flag; Flax is NHWC already"},
                  needs={"torch": ("cuda", "the layout changes on a CPU, but there are no tensor cores to feed")}),
    Applicability("device_prefetch", lambda c: c.device_prefetch > 0,
                  elsewhere={"torch": "a JAX input-pipeline setting; torch's analogue is pin_mem with non-blocking "
                                      "copies"}),
    Applicability("xla_flags", lambda c: bool(c.xla_flags), elsewhere={"torch": "a JAX flag"}),
    Applicability("jax_parallel", lambda c: c.jax_parallel != "sharding",
                  elsewhere={"torch": "a JAX data-parallel engine; torch's is DDP"}),
    Applicability("processes", lambda c: c.processes > 1,
                  elsewhere={"torch": "torch runs one DDP process per device"}),
    Applicability("torchcompile_mode", lambda c: c.torchcompile_mode != "default",
                  elsewhere={"jax": "a torch.compile mode; jax.jit has none"}, needs_compiled=True),
    Applicability("torchcompile_backend", lambda c: c.torchcompile_backend != "inductor",
                  elsewhere={"jax": "a torch.compile backend; jax.jit has one compiler, XLA"}, needs_compiled=True),
    Applicability("compile_dynamic", lambda c: c.compile_dynamic != "default",
                  elsewhere={"jax": "a torch.compile setting; jax.jit compiles a program per input shape (bucketing "
                                    "is how JAX bounds them)"}, needs_compiled=True),
    Applicability("compile_scope", lambda c: c.compile_scope != "step", needs_compiled=True),
    Applicability("remat_policy", lambda c: bool(c.remat_plan) and c.remat_policy != "nothing_saveable",
                  elsewhere={"torch": "a jax.checkpoint policy; torch's checkpoint recomputes everything inside the "
                                      "region (nothing_saveable)"}),
)


def no_effect_notes(config: RunConfig, framework: str, platform: str) -> list[str]:
    """The run's settings that change nothing in ``framework`` on a device of ``platform`` (cpu, cuda, gpu, ...),
    each with the reason, from ``TABLE``."""
    notes = []
    for rule in TABLE:
        if not rule.is_set(config):
            continue
        setting = f"{rule.field}={getattr(config, rule.field)}"
        if framework in rule.elsewhere:
            notes.append(f"{setting}: no effect in {framework} ({rule.elsewhere[framework]})")
        elif rule.needs_compiled and config.compile != "compiled":
            notes.append(f"{setting}: no effect on an uncompiled run")
        elif framework in rule.needs and platform != rule.needs[framework][0]:
            notes.append(f"{setting}: no effect here ({rule.needs[framework][1]})")
    return notes
