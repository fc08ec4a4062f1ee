"""The host a number came from, recorded with every row and part of the settings a resumed plan must match
(experiments/execution/store.py): Python, the CPU and GPUs, the measured libraries' versions, and what the hardware
does natively. Read without importing a framework, so the driver stays light.

Capabilities are detected, never assumed: the CPU's vector and matrix extensions that decide whether bf16/fp16
arithmetic is native or emulated, and each CUDA GPU's compute capability. A technique the hardware emulates still
runs, since it is the article's technique, but the report flags it "emulated on this device" with its measured cost
instead of letting it look like a slow technique.

Detection can be overridden, to simulate another machine (tests, or a reader checking a report's logic):
``TWINRUN_CPU_FLAGS`` (comma-separated /proc/cpuinfo flags, replacing the detected ones) and
``TWINRUN_GPU_CAPABILITY`` (e.g. ``8.0``; ``none`` for no GPU).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

# The /proc/cpuinfo flags that matter for the article's techniques on a CPU.
CPU_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16",
                         "avx_vnni", "avx512_vnni")
# Native bf16 arithmetic on x86: AVX512-BF16 (dot products) or AMX-BF16 (tiles); oneDNN and XLA use either.
CPU_BF16 = ("avx512_bf16", "amx_bf16")
CPU_FP16 = ("avx512_fp16", "amx_fp16")
CPU_FLAGS_ENV = "TWINRUN_CPU_FLAGS"
GPU_CAPABILITY_ENV = "TWINRUN_GPU_CAPABILITY"
CAPABILITY = re.compile(r"\d+\.\d+")  # a CUDA compute capability as nvidia-smi prints it: 8.0, 9.0, 12.0


@dataclass(frozen=True)
class Capabilities:
    cpu_flags: tuple[str, ...]  # those of CPU_FLAGS_OF_INTEREST this CPU has
    gpu_capability: str | None  # CUDA compute capability of the first GPU ("9.0"), None without one
    simulated: bool = False  # an override replaced the detection

    @property
    def cpu_bf16(self) -> bool:
        return any(flag in self.cpu_flags for flag in CPU_BF16)

    @property
    def cpu_fp16(self) -> bool:
        return any(flag in self.cpu_flags for flag in CPU_FP16)

    @property
    def gpu_bf16(self) -> bool:
        return self.gpu_capability is not None and _major(self.gpu_capability) >= 8  # Ampere on

    @property
    def gpu_fp16(self) -> bool:
        return self.gpu_capability is not None and _major(self.gpu_capability) >= 7  # tensor cores: Volta on

    @property
    def gpu_tf32(self) -> bool:
        return self.gpu_bf16  # TF32 tensor cores came with bf16 (Ampere)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_flags": list(self.cpu_flags), "cpu_bf16": self.cpu_bf16,
                "cpu_fp16": self.cpu_fp16, "gpu_bf16": self.gpu_bf16, "gpu_fp16": self.gpu_fp16,
                "gpu_tf32": self.gpu_tf32}

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> Capabilities | None:
        if not values:
            return None  # a row from before capabilities were recorded
        return cls(tuple(values.get("cpu_flags", ())), values.get("gpu_capability"), bool(values.get("simulated")))

    def summary(self) -> str:
        """One line for a report header."""
        cpu = ", ".join(self.cpu_flags) or "none of " + "/".join(CPU_FLAGS_OF_INTEREST[:3])
        gpu = (f"CUDA compute capability {self.gpu_capability} (bf16 {_yes(self.gpu_bf16)}, fp16 tensor cores "
               f"{_yes(self.gpu_fp16)}, TF32 {_yes(self.gpu_tf32)})" if self.gpu_capability else "no CUDA GPU")
        return (f"CPU flags: {cpu} (native bf16 {_yes(self.cpu_bf16)}, native fp16 {_yes(self.cpu_fp16)}); {gpu}"
                + (" [simulated by override]" if self.simulated else ""))


def _major(capability: str) -> int:
    return int(capability.split(".")[0])


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def emulation(precision: str, on_gpu: bool, caps: Capabilities | None) -> str | None:
    """Why ``precision`` is emulated on this device (None: native, fp32/fp64, or not known for an old row)."""
    if caps is None or precision not in ("bf16", "fp16"):
        return None
    if on_gpu:
        native = caps.gpu_bf16 if precision == "bf16" else caps.gpu_fp16
        need = "compute capability 8.0 or more" if precision == "bf16" else "tensor cores (7.0 or more)"
        return None if native else f"{precision} emulated on this device (GPU {caps.gpu_capability}; needs {need})"
    native = caps.cpu_bf16 if precision == "bf16" else caps.cpu_fp16
    flags = CPU_BF16 if precision == "bf16" else CPU_FP16
    return None if native else f"{precision} emulated on this device (CPU without {' or '.join(flags)})"


def simulated_gpu() -> str | None:
    """The compute capability ``TWINRUN_GPU_CAPABILITY`` simulates (None: no GPU), checked for its form: a value
    that is not one would run every job and then fail in the host record stored with its row."""
    value = os.environ.get(GPU_CAPABILITY_ENV, "").strip()
    if value.lower() in ("", "none"):
        return None
    if not CAPABILITY.fullmatch(value):
        raise ConfigError(f"{GPU_CAPABILITY_ENV}={value!r} is not a CUDA compute capability: give major.minor "
                          f"(such as 8.0 or 9.0), or none for no GPU")
    return value


def check_overrides() -> None:
    """Refuses a malformed simulation override before any command runs (``simulated_gpu``)."""
    if GPU_CAPABILITY_ENV in os.environ:
        simulated_gpu()


def detect() -> Capabilities:
    """This machine's capabilities, or the simulated ones the environment asks for."""
    flags_override = os.environ.get(CPU_FLAGS_ENV)
    gpu_override = os.environ.get(GPU_CAPABILITY_ENV)
    if flags_override is not None:
        cpu = tuple(f for f in CPU_FLAGS_OF_INTEREST if f in {x.strip() for x in flags_override.split(",")})
    else:
        cpu = _cpu_flags()
    gpu = simulated_gpu() if gpu_override is not None else _gpu_capability()
    return Capabilities(cpu, gpu, simulated=flags_override is not None or gpu_override is not None)


def _cpu_flags() -> tuple[str, ...]:
    present = set((_cpuinfo("flags") or "").split())  # not Linux: unknown, so nothing is claimed native
    return tuple(f for f in CPU_FLAGS_OF_INTEREST if f in present)


def _gpu_capability() -> str | None:
    """The first GPU's compute capability."""
    listed = _nvidia_smi("compute_cap")
    return listed[0] if listed else None


@functools.cache
def _cpuinfo(name: str) -> str | None:
    """The value of the first /proc/cpuinfo line named ``name`` (None off Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.cache
def _nvidia_smi(query: str) -> tuple[str, ...]:
    """``nvidia-smi --query-gpu=QUERY``, a value per GPU (none without the tool), read without initialising CUDA in
    this process."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return ()
    try:
        listed = subprocess.run([tool, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in listed.splitlines() if line.strip())


# the libraries a twinrun measurement depends on
MEASURED_PACKAGES = ("torch", "torchvision", "jax", "jaxlib", "flax", "optax", "numpy")


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


@functools.cache
def _host() -> dict[str, object]:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
            "gpus": list(_nvidia_smi("name")), "versions": package_versions(MEASURED_PACKAGES),
            "capabilities": detect().to_dict()}


def host_info() -> dict[str, object]:
    return dict(_host())
