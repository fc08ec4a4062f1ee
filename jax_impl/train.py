"""The JAX training step and its parts. torch_impl/train.py has the same functions with the same parameters
(tests/test_twins.py checks it), so the two can be read side by side; jax_impl/backend.py hands them to the one
training loop (common/loop.py).

A model here is what ``make_model`` returns: the Flax module and its variables, one value where torch has the module
holding its parameters, so both sides' functions take one ``model``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.config import RunConfig
from common.model_options import ModelOptions
from common.schedule import learning_rate
from common.weights import flax_to_torch, load_torch_keyed, save_torch_keyed, torch_to_flax
from common.workloads import arch as describe
from jax_impl import mesh as axes
from jax_impl import models as registry
from jax_impl import transformer
from jax_impl.amp import LossScale, all_finite, compute_dtype
from jax_impl.checkpoint import TrainState
from jax_impl.models import init_variables
from jax_impl.techniques import param_dtype

StepFn = Callable[[TrainState, jax.Array, jax.Array, jax.Array], tuple[TrainState, jax.Array]]


Module = Any  # a Flax module of one family (the registry, jax_impl/models.py)
Model = tuple[Module, dict[str, Any]]  # the module and its variables: torch's module with its parameters


class Optimizer(NamedTuple):
    """What the step updates with (torch_impl/train.py's twin): optax's transformation, the LR schedule and
    MultiSteps' accumulation inside it, and the state the step threads through its calls, from the model's variables
    (the optimizer's and the fp16 loss scale's included: torch's objects hold theirs)."""

    tx: optax.GradientTransformation
    state: TrainState


def build(config: RunConfig, arch: Any) -> Module:
    """The model of ``arch``'s family (the registry, jax_impl/models.py) with the run's techniques set on it."""
    options = ModelOptions.of(config, jnp.dtype(compute_dtype(config)).name, axes.bn_axis_name(config))
    return registry.make_model(arch, options)


def make_model(config: RunConfig, arch: Any) -> Model:
    model = build(config, arch)
    def init() -> dict[str, Any]:
        return init_variables(model, config.seed, config.image_size)

    if config.init_weights:  # the same initial weights as the torch run (torch-keyed .npz): shapes suffice
        variables = torch_to_flax(load_torch_keyed(config.init_weights), jax.eval_shape(init), config.init_weights)
    else:
        variables = init()
    variables = jax.tree.map(lambda a: jnp.asarray(a, param_dtype(config)), dict(variables))
    return model, variables


def kernel_notes(config: RunConfig, arch: Any) -> list[str]:
    """Which attention kernel this run's transformer runs (torch_impl/train.py says the same of torch's)."""
    if not arch.attention:
        unused = config.attention != "fused"
        return [f"attention={config.attention}: no effect on {arch.name} (no attention)"] if unused else []
    if config.attention == "naive":
        return ["attention: naive (softmax(QK^T/sqrt(d))V written out, softmax in fp32)"]
    if config.precision == "fp64":
        return ["attention: fused asked, the written-out path ran (XLA's implementation rounds fp64 scores to fp32)"]
    implementation = transformer.fused_implementation()
    if config.precision == "fp16" and implementation != "cudnn":
        return ["attention: fused asked, the written-out path ran (XLA's implementation asks for an fp16 x fp16 -> "
                "fp32 dot that XLA here cannot compile)"]
    if implementation == "cudnn" and config.precision not in ("bf16", "fp16"):
        implementation = "xla"
    masked = " with the padding mask" if arch.masked else ""
    return [f"attention: fused, jax.nn.dot_product_attention ran its {implementation} implementation{masked}"]


def make_optimizer(config: RunConfig, model: Model, total_steps: int) -> Optimizer:
    """The torch optimizers' formulas: SGD = coupled weight decay added to the gradient, then momentum
    trace, then LR (torch.optim.SGD); AdamW = decoupled decay (torch.optim.AdamW). k > 1 wraps the
    optimizer in optax.MultiSteps, which averages k micro-batch gradients and updates once (torch's step counts
    its calls the same way). With the initial train state of ``model``'s variables."""
    def schedule(count: jax.Array) -> jax.Array:
        return learning_rate(count, config, total_steps, jnp)

    if config.optimizer == "sgd":
        tx = optax.chain(optax.add_decayed_weights(config.weight_decay), optax.sgd(schedule, momentum=config.momentum))
    else:
        tx = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=config.weight_decay)
    if config.grad_accum_steps > 1:
        # the accumulator in the parameters' dtype: optax's default is fp32, which in fp64 rounded the averaged
        # gradient to fp32 (weights 6e-9 off the big batch's after 4 steps; tests/test_vit_trainers.py)
        tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps, accumulator_dtype=param_dtype(config))
    _, variables = model
    # One program makes the optimizer state and the loss scale: op by op, each zeros_like of a new shape compiles
    # on its own (17 programs, ~4 s of a cpu-preset run here, before its first step)
    state = jax.jit(lambda params, stats: TrainState(params, stats, tx.init(params), LossScale.create(config)))(
        variables["params"], variables.get("batch_stats", {}))
    return Optimizer(tx, state)


def loss_fn(config: RunConfig, logits: jax.Array, labels: jax.Array) -> jax.Array:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype
    # (torch: F.cross_entropy with label_smoothing). The classes are the logits' last axis, as torch reads them.
    dtype = param_dtype(config)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=dtype), config.label_smoothing)
    return optax.softmax_cross_entropy(logits.astype(dtype), targets).mean()


def make_train_step(config: RunConfig, model: Model, optimizer: Optimizer) -> StepFn:
    """One micro-batch step (with MultiSteps, every k-th call updates the parameters). fp16 scales the
    loss, unscales the gradients and, if any is inf/nan, keeps parameters and optimizer state. The state is the
    step's argument; ``model``'s variables only gave the first one (``make_optimizer``)."""
    fp16 = config.precision == "fp16"
    module, _ = model
    tx = optimizer.tx

    def gradients(state: TrainState, images: jax.Array, labels: jax.Array, inject_inf: jax.Array):
        """Forward and backward: the unscaled gradients, the loss and the new BatchNorm statistics."""
        def scaled_loss(params):
            logits, updates = module.apply({"params": params, "batch_stats": state.batch_stats}, images,
                                           train=True, mutable=["batch_stats"])
            loss = loss_fn(config, logits, labels)
            return loss * state.loss_scale.scale, (loss, updates.get("batch_stats", state.batch_stats))

        params = axes.per_replica(config, state.params)
        (_, (loss, batch_stats)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        grads, loss, batch_stats = axes.reduce_across_replicas(config, grads, loss, batch_stats)
        grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
        # Test hook: an overflowing gradient, as fp16 produces.
        leaves, treedef = jax.tree.flatten(grads)
        return jax.tree.unflatten(treedef, [jnp.where(inject_inf, jnp.inf, leaves[0])] + leaves[1:]), loss, batch_stats

    def update(state: TrainState, grads: Any, loss: jax.Array, batch_stats: Any):
        """The optimizer's update (fp16: kept only where every gradient is finite, and the loss scale moved)."""
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if fp16:
            finite = all_finite(grads)
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
            loss_scale = state.loss_scale.update(finite)
        else:
            loss_scale = state.loss_scale
        return TrainState(params, batch_stats, opt_state, loss_scale), loss

    def step(state: TrainState, images: jax.Array, labels: jax.Array, inject_inf: jax.Array):
        return update(state, *gradients(state, images, labels, inject_inf))

    if config.devices > 1:
        return step  # the caller makes it data parallel (jax_impl/parallel.py)
    if config.compile == "compiled" and config.compile_scope == "model":
        # forward and backward one program, the update op by op: torch.compile(model)'s scope
        compiled_gradients = jax.jit(gradients)

        def model_step(state: TrainState, images: jax.Array, labels: jax.Array, inject_inf: jax.Array):
            return update(state, *compiled_gradients(state, images, labels, inject_inf))

        model_step._cache_size = compiled_gradients._cache_size  # type: ignore[attr-defined]  # programs compiled
        return model_step
    if config.compile == "compiled":
        return jax.jit(step, donate_argnums=(0,))  # donated: the old state's buffers are reused in place
    # Eager: the step without jax.jit, as a JAX user meets it outside jit: each operation is dispatched on its own
    # (JAX's and Flax's own jitted helpers stay single programs, as in any un-jitted JAX code). jax.disable_jit,
    # used before, also took those helpers apart: 1211 -> 479 ms a step, ResNet-18 width 0.125 batch 64 here.
    return step


def _eval_batch(config: RunConfig, module: Module) -> Callable:
    """(variables, images, labels) -> (summed loss, correct predictions) of one evaluation batch, one program."""
    def scores(variables: Any, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = module.apply(variables, images, train=False).astype(param_dtype(config))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()
        return loss, (logits.argmax(1) == labels).sum()

    return scores


def evaluate(config: RunConfig, model: Model, loader) -> dict[str, float]:
    """Accuracy and mean loss over the evaluation loader's batches (at most ``eval_batches``)."""
    # Always jitted, the loss and the count included: evaluation is not timed, and op by op it would compile every
    # primitive again (~5 s)
    module, variables = model
    batch_scores = jax.jit(_eval_batch(config, module))
    correct, seen, loss_sum = 0, 0, 0.0
    for number, (images, labels) in enumerate(loader.epoch(0)):
        if config.eval_batches is not None and number >= config.eval_batches:
            break
        loss, right = batch_scores(variables, images, labels)
        loss_sum += float(loss)
        correct += int(right)
        seen += len(labels)
    return {"accuracy": correct / seen, "loss": loss_sum / seen, "samples": seen}


def measure_saved_bytes(config: RunConfig, model: Model, images: jax.Array, labels: jax.Array) -> int:
    """Bytes of the residuals JAX keeps for the backward pass of one micro-batch (the mirror of torch's
    saved-tensor hooks). Where XLA's compiled temp size hides remat's saving (XLA:CPU, seen here), this
    still shows what jax.checkpoint removed."""
    from jax._src.ad_checkpoint import (
        saved_residuals,  # public only as print_saved_residuals
    )

    module, variables = model
    batch_stats = variables.get("batch_stats", {})

    def loss(params):
        logits, _ = module.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                 mutable=["batch_stats"])
        return loss_fn(config, logits, labels)

    # BatchNorm synchronised across replicas (shard_map, pmap) averages over a named axis: traced here under a vmap
    # of one that names it, which adds nothing to what is saved
    axis = axes.bn_axis_name(config)
    traced = loss if axis is None else (lambda p: jax.vmap(loss, in_axes=None, axis_size=1, axis_name=axis)(p)[0])
    # Saved weights count too, as they do in torch's hooks.
    residuals = saved_residuals(traced, variables["params"])
    return int(sum(np.prod(aval.shape) * aval.dtype.itemsize for aval, _ in residuals))


def export_initial_weights(config: RunConfig, num_classes: int, path: str) -> None:
    """Writes this config's freshly initialised Flax weights as a torch-keyed .npz (torch_impl/train.py's twin; the
    paired runs start from the initialiser's: experiments/execution/frameworks.py's INITIALISER, torch)."""
    _, variables = make_model(config.replace(init_weights=None), describe(config, num_classes))
    save_torch_keyed(path, flax_to_torch(variables))
