"""Paired checks that prove both sides compute the same thing, in this process (the weight transfer itself is
common/weights.py). Any family with float inputs (a ResNet, a ViT, a workload from outside the repository), built
by each framework's registry (torch_impl/models.py, jax_impl/models.py) with the ``attention`` kernel asked for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.arch import ResNetArch
from common.arch_encoder import EncoderArch
from common.model_options import ModelOptions
from common.weights import flax_grads_to_torch, flax_to_torch, torch_to_flax


def load_flax_into_torch(model: Any, variables: Mapping[str, Any]) -> None:
    import torch

    state = model.state_dict()
    for key, value in flax_to_torch(variables).items():
        if key not in state:
            raise KeyError(f"Flax variable maps to '{key}', which the torch model does not have")
        state[key] = torch.from_numpy(np.array(value)).to(state[key].dtype)  # a writable copy
    model.load_state_dict(state)


def max_relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: a scale-aware difference that stays finite where b has zeros."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.abs(b).max()), 1e-12)
    return float(np.abs(a - b).max() / scale)


Arch = ResNetArch | EncoderArch


@dataclass(frozen=True)
class Quantities:
    """What one framework computes on one batch: eval and train logits, the loss, the running statistics after the
    train-mode pass and the gradients (torch-keyed)."""

    logits_eval: np.ndarray
    logits_train: np.ndarray
    loss: np.ndarray
    bn_statistics: dict[str, np.ndarray]
    gradients: dict[str, np.ndarray]


def compare(a: Quantities, b: Quantities) -> dict[str, float]:
    """Max relative difference of ``a`` from ``b``, per quantity."""
    return {
        "logits_eval": max_relative_difference(a.logits_eval, b.logits_eval),
        "logits_train": max_relative_difference(a.logits_train, b.logits_train),
        "loss": max_relative_difference(a.loss, b.loss),
        "bn_statistics": max((max_relative_difference(v, b.bn_statistics[k]) for k, v in a.bn_statistics.items()),
                             default=0.0),
        "gradients": max(max_relative_difference(a.gradients[k], b.gradients[k]) for k in b.gradients),
    }


def paired_forward_backward(arch: Arch, batch_size: int = 8, image_size: int = 32, seed: int = 0,
                            float64: bool = False, attention: str = "fused") -> dict[str, float]:
    """Random torch weights -> Flax; the same batch through both in fp32 (or fp64, which separates a
    semantic difference from rounding amplified through a deep network); max relative differences."""
    torch_side, flax_side = forward_backward(arch, batch_size, image_size, seed, float64, attention)
    return compare(flax_side, torch_side)


def fp32_gaps_and_noise_floor(arch: Arch, batch_size: int = 8, image_size: int = 32, seed: int = 0,
                              attention: str = "fused") -> tuple[dict[str, float], dict[str, float]]:
    """(torch vs Flax in fp32, this machine's fp32 noise floor). The floor: how far each framework's fp32 result
    lies from its own fp64 result on the same weights and batch, summed over the two frameworks; by the triangle
    inequality, the most that two fp32 computations of the same function can differ here. A ReLU input within
    rounding of zero that flips in fp32 on this CPU shows up in it as a large gradient term, in the framework where
    it flipped; a real difference between the implementations shows up in neither framework's term."""
    torch32, flax32 = forward_backward(arch, batch_size, image_size, seed, False, attention)
    torch64, flax64 = forward_backward(arch, batch_size, image_size, seed, True, attention)
    torch_floor, flax_floor = compare(torch32, torch64), compare(flax32, flax64)
    return compare(flax32, torch32), {name: torch_floor[name] + flax_floor[name] for name in torch_floor}


def model_builders(arch: Arch, attention: str = "fused") -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """(torch model factory, Flax model factory taking the compute dtype) of ``arch``'s family, from each framework's
    registry; ``attention`` (naive or fused) is the transformer's kernel and means nothing to a model without one."""
    from jax_impl.models import make_model as make_flax
    from torch_impl.models import make_model as make_torch

    return (lambda: make_torch(arch, ModelOptions(attention=attention)),
            lambda dtype: make_flax(arch, ModelOptions(dtype=np.dtype(dtype).name, attention=attention)))


def forward_backward(arch: Arch, batch_size: int, image_size: int, seed: int, float64: bool,
                     attention: str = "fused") -> tuple[Quantities, Quantities]:
    """(torch, Flax) quantities on the same torch-initialised weights and the same batch (drawn in fp64, rounded to
    fp32 for an fp32 pass)."""
    import jax
    import jax.numpy as jnp
    import torch

    from jax_impl.models import init_variables

    if arch.family == "vit" and image_size != arch.image_size:
        raise ValueError(f"{arch.name} is built for {arch.image_size}-pixel images (its position embeddings), "
                         f"not {image_size}")
    make_torch, make_flax = model_builders(arch, attention)

    dtype = np.float64 if float64 else np.float32
    torch.manual_seed(seed)
    torch.set_float32_matmul_precision("highest")
    rng = np.random.default_rng(seed)
    images = rng.normal(size=arch.example(batch_size, image_size).shape).astype(dtype)  # float inputs of its shape
    labels = rng.integers(0, arch.num_classes, size=batch_size)
    torch_model = make_torch().to(torch.float64 if float64 else torch.float32)
    with jax.enable_x64(float64), jax.default_matmul_precision("highest"):
        flax_model = make_flax(jnp.dtype(dtype))
        # shapes only (the values are torch's): an eager init would compile every op on its own
        shapes = jax.eval_shape(lambda: init_variables(flax_model, 0, image_size))
        template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, dtype), shapes)
        variables = torch_to_flax(torch_model.state_dict(), template)
        flax_side = _flax_quantities(flax_model, variables, images, labels)
    return _torch_quantities(torch_model, images, labels), flax_side


def _torch_quantities(model: Any, images: np.ndarray, labels: np.ndarray) -> Quantities:
    import torch

    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    model.eval()  # eval mode: running statistics
    with torch.no_grad():
        logits_eval = model(x).numpy()
    model.train()  # train mode: batch statistics, running-statistic updates and gradients of the cross-entropy
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
    loss.backward()
    state = model.state_dict()
    statistics = {k: v.numpy() for k, v in state.items() if k.endswith(("running_mean", "running_var"))}
    return Quantities(logits_eval, logits.detach().numpy(), loss.detach().numpy(), statistics,
                      {name: p.grad.numpy() for name, p in model.named_parameters()})


def _flax_quantities(model: Any, variables: Mapping[str, Any], images: np.ndarray, labels: np.ndarray) -> Quantities:
    import jax
    import jax.numpy as jnp
    import optax

    stats_in = {"batch_stats": variables["batch_stats"]} if "batch_stats" in variables else {}
    x, y = jnp.asarray(images), jnp.asarray(labels)
    # jitted: op by op, Flax would compile every primitive on its own (tens of seconds for a ResNet-50); the batch
    # and the statistics are arguments, not constants, so that another seed's check reuses the compiled programs
    logits_eval = np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x))

    def loss_fn(params: Any, stats: Any, x: Any, y: Any) -> Any:
        logits, updates = model.apply({"params": params, **stats}, x, train=True, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, (logits, updates)

    (loss, (logits, updates)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
        variables["params"], stats_in, x, y)
    statistics = flax_to_torch({"batch_stats": updates.get("batch_stats", {})})
    return Quantities(logits_eval, np.asarray(logits), np.asarray(loss), statistics, flax_grads_to_torch(grads))


TOLERANCES = {"logits_eval": 1e-5, "logits_train": 1e-5, "loss": 1e-5, "bn_statistics": 1e-5, "gradients": 1e-4}
