"""A framework's family registry: family -> the builder of its model, every builder of one signature
``(arch, options) -> model``. torch_impl/models.py and jax_impl/models.py each hold one; a workload from outside the
repository registers its builders in them (common/workloads.py's ``load_workload``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.errors import UnknownFamily
from common.model_options import ModelOptions

Builder = Callable[[Any, ModelOptions], Any]


class Registry:
    def __init__(self, framework: str, builders: dict[str, Builder]) -> None:
        self.framework = framework
        self.builders = dict(builders)

    def register(self, family: str, builder: Builder) -> None:
        self.builders[family] = builder

    def build(self, arch: Any, options: ModelOptions) -> Any:
        """The model of ``arch``'s family (a dict lookup: no family is tested for by name)."""
        builder = self.builders.get(arch.family)
        if builder is None:
            raise UnknownFamily(f"no {self.framework} model is registered for the family '{arch.family}' "
                                f"({arch.name}); known: {', '.join(self.builders)}")
        return builder(arch, options)
