"""The one place that maps a framework's name to its package. Imports are lazy (importlib), so a process that
runs a torch job never loads JAX, and the reverse."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from common.config import RunConfig
from common.errors import ConfigError
from common.results import RunResult
from common.workloads import workload_for

FRAMEWORKS: tuple[str, ...] = ("torch", "jax")
PACKAGES: dict[str, str] = {"torch": "torch_impl", "jax": "jax_impl"}
CHOICES: tuple[str, ...] = (*FRAMEWORKS, "both")  # a command's --framework
# The packages whose versions a loader measurement records, per framework (the JAX loader is grain's).
LOADER_PACKAGES: dict[str, tuple[str, ...]] = {"torch": ("torch",), "jax": ("torch", "jax", "grain")}
# The framework whose initialisation paired runs start from (its weights are transferred to the other).
INITIALISER = "torch"


def selected(choice: str, model: str | None = None) -> tuple[str, ...]:
    """The frameworks a ``--framework`` choice names (both, or one) that ``model``'s workload has a model in; each
    other one is skipped, its reason printed (a workload from outside the repository may bring one framework's)."""
    if choice != "both":
        package_of(choice)  # an unknown name is a named error
    names = FRAMEWORKS if choice == "both" else (choice,)
    if model is None:
        return names
    workload = workload_for(model)
    for name in names:
        if reason := workload.missing(name):
            print(f"{name}: skipped ({reason})")
    kept = tuple(name for name in names if not workload.missing(name))
    if not kept:
        raise ConfigError(f"nothing to run: {workload.missing(names[0])}")
    return kept


def package_of(name: str) -> str:
    if name not in PACKAGES:
        raise ConfigError(f"unknown framework '{name}'; known: {', '.join(FRAMEWORKS)}")
    return PACKAGES[name]


def module(name: str, part: str) -> ModuleType:
    """``<framework package>.<part>``, e.g. module("jax", "data") is jax_impl.data (imported on first use)."""
    return importlib.import_module(f"{package_of(name)}.{part}")


def fit_function(name: str) -> Callable[[RunConfig], RunResult]:
    """The framework's trainer: ``<package>.backend.fit(config) -> RunResult`` (the one loop, its backend)."""
    return module(name, "backend").fit


def _torch_device() -> str:
    return str(module("torch", "data").default_device())


def _jax_device() -> str:
    import jax

    return str(jax.devices()[0])


_DEVICES: dict[str, Callable[[], str]] = {"torch": _torch_device, "jax": _jax_device}


def device_name(name: str) -> str:
    """The device a job of framework ``name`` runs on in this process."""
    package_of(name)
    return _DEVICES[name]()
