"""Which machine and library versions a number came from (recorded with every row, and part of the settings a
resumed plan must match: common/store.py). Read without importing a framework, so the driver stays light."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

from common.capabilities import detect

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


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def gpu_names() -> tuple[str, ...]:
    """The NVIDIA GPUs nvidia-smi lists (none without the tool), read without initialising CUDA here."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return ()
    try:
        listed = subprocess.run([tool, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in listed.splitlines() if line.strip())


@functools.cache
def _host() -> dict[str, object]:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
            "gpus": list(gpu_names()), "versions": package_versions(MEASURED_PACKAGES),
            "capabilities": detect().to_dict()}


def host_info() -> dict[str, object]:
    return dict(_host())
