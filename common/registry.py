"""A framework's family registry: family -> the builder of its model, every builder of one signature
``(arch, options) -> model``. torch_impl/models.py and jax_impl/models.py each hold one; a workload from outside the
repository brings its builders, which a registry finds by family after its own (common/workloads.py's
``load_workload``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.errors import UnknownFamily
from common.model_options import ModelOptions
from common.workloads import FRAMEWORK_NAMES, builder_of

Builder = Callable[[Any, ModelOptions], Any]


class Registry:
    def __init__(self, framework: str, builders: dict[str, Builder]) -> None:
        self.framework = framework  # torch or jax
        self.builders = dict(builders)

    def register(self, family: str, builder: Builder) -> None:
        self.builders[family] = builder

    def build(self, arch: Any, options: ModelOptions) -> Any:
        """The model of ``arch``'s family (a dict lookup: no family is tested for by name): a registered builder,
        else the one a workload loaded from outside the repository brings (common/workloads.py)."""
        builder = self.builders.get(arch.family) or builder_of(arch.family, self.framework)
        if builder is None:
            raise UnknownFamily(f"no {FRAMEWORK_NAMES[self.framework]} model is registered for the family "
                                f"'{arch.family}' ({arch.name}); known: {', '.join(self.builders)}")
        return builder(arch, options)
