"""The JAX training step and its parts. torch_impl/train.py has the same functions with the same roles
(make_model, make_optimizer, loss_fn, make_train_step, evaluate, measure_saved_bytes), so the two can be read
side by side; jax_impl/backend.py hands them to the one training loop (common/loop.py)."""

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
from common.weights import load_torch_keyed, torch_to_flax
from jax_impl import models as registry
from jax_impl import parallel, transformer
from jax_impl.models import init_variables
from jax_impl.techniques import (
    LossScale,
    all_finite,
    compute_dtype,
    param_dtype,
)


class TrainState(NamedTuple):
    params: Any
    batch_stats: Any
    opt_state: Any
    loss_scale: LossScale


StepFn = Callable[[TrainState, jax.Array, jax.Array, jax.Array], tuple[TrainState, jax.Array]]


Model = Any  # a Flax module of one family (the registry, jax_impl/models.py)


def build(config: RunConfig, arch: Any) -> Model:
    """The model of ``arch``'s family (the registry, jax_impl/models.py) with the run's techniques set on it."""
    options = ModelOptions.of(config, jnp.dtype(compute_dtype(config)).name, parallel.bn_axis_name(config))
    return registry.make_model(arch, options)


def make_model(config: RunConfig, arch: Any) -> tuple[Model, dict[str, Any]]:
    model = build(config, arch)
    def init() -> dict[str, Any]:
        return init_variables(model, jax.random.key(config.seed), config.image_size)

    if config.init_weights:  # the same initial weights as the torch run (torch-keyed .npz): shapes suffice
        variables = torch_to_flax(load_torch_keyed(config.init_weights), jax.eval_shape(init))
    else:  # jitted: run op by op, Flax's init compiles every primitive on its own (9.5 s for a small ResNet)
        variables = jax.jit(init)()
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


def make_optimizer(config: RunConfig, total_steps: int) -> optax.GradientTransformation:
    """The torch optimizers' formulas: SGD = coupled weight decay added to the gradient, then momentum
    trace, then LR (torch.optim.SGD); AdamW = decoupled decay (torch.optim.AdamW). k > 1 wraps the
    optimizer in optax.MultiSteps, which averages k micro-batch gradients and updates once."""
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
    return tx


def loss_fn(config: RunConfig, logits: jax.Array, labels: jax.Array, num_classes: int) -> jax.Array:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype
    # (torch: F.cross_entropy with label_smoothing).
    dtype = param_dtype(config)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes, dtype=dtype), config.label_smoothing)
    return optax.softmax_cross_entropy(logits.astype(dtype), targets).mean()


def make_train_step(config: RunConfig, model: Model, tx: optax.GradientTransformation, num_classes: int) -> StepFn:
    """One micro-batch step (with MultiSteps, every k-th call updates the parameters). fp16 scales the
    loss, unscales the gradients and, if any is inf/nan, keeps parameters and optimizer state."""
    fp16 = config.precision == "fp16"

    def gradients(state: TrainState, images: jax.Array, labels: jax.Array, inject_inf: jax.Array):
        """Forward and backward: the unscaled gradients, the loss and the new BatchNorm statistics."""
        def scaled_loss(params):
            logits, updates = model.apply({"params": params, "batch_stats": state.batch_stats}, images,
                                          train=True, mutable=["batch_stats"])
            loss = loss_fn(config, logits, labels, num_classes)
            return loss * state.loss_scale.scale, (loss, updates.get("batch_stats", state.batch_stats))

        params = parallel.per_replica(config, state.params)
        (_, (loss, batch_stats)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        grads, loss, batch_stats = parallel.reduce_across_replicas(config, grads, loss, batch_stats)
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
            loss_scale = state.loss_scale.update(finite, config.loss_scale_growth_interval)
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


def _eval_batch(config: RunConfig, model: Model) -> Callable:
    """(variables, images, labels) -> (summed loss, correct predictions) of one evaluation batch, one program."""
    def scores(variables: Any, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = model.apply(variables, images, train=False).astype(param_dtype(config))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()
        return loss, (logits.argmax(1) == labels).sum()

    return scores


def evaluate(config: RunConfig, model: Model, state: TrainState, loader) -> dict[str, float]:
    """Accuracy and mean loss over the evaluation loader's batches (at most ``eval_batches``)."""
    # Always jitted, the loss and the count included: evaluation is not timed, and op by op it would compile every
    # primitive again (~5 s)
    batch_scores = jax.jit(_eval_batch(config, model))
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    correct, seen, loss_sum = 0, 0, 0.0
    for number, (images, labels) in enumerate(loader.epoch(0)):
        if config.eval_batches is not None and number >= config.eval_batches:
            break
        loss, right = batch_scores(variables, images, labels)
        loss_sum += float(loss)
        correct += int(right)
        seen += len(labels)
    return {"accuracy": correct / seen, "loss": loss_sum / seen, "samples": seen}


def measure_saved_bytes(config: RunConfig, model: Model, state: TrainState, images: jax.Array,
                        labels: jax.Array) -> int:
    """Bytes of the residuals JAX keeps for the backward pass of one micro-batch (the mirror of torch's
    saved-tensor hooks). Where XLA's compiled temp size hides remat's saving (XLA:CPU, seen here), this
    still shows what jax.checkpoint removed."""
    from jax._src.ad_checkpoint import (
        saved_residuals,  # public only as print_saved_residuals
    )

    def loss(params):
        logits, _ = model.apply({"params": params, "batch_stats": state.batch_stats}, images, train=True,
                                mutable=["batch_stats"])
        return loss_fn(config, logits, labels, model.arch.num_classes)

    # BatchNorm synchronised across replicas (shard_map, pmap) averages over a named axis: traced here under a vmap
    # of one that names it, which adds nothing to what is saved
    axis = parallel.bn_axis_name(config)
    traced = loss if axis is None else (lambda p: jax.vmap(loss, in_axes=None, axis_size=1, axis_name=axis)(p)[0])
    # Saved weights count too, as they do in torch's hooks.
    return int(sum(np.prod(aval.shape) * aval.dtype.itemsize for aval, _ in saved_residuals(traced, state.params)))


def measure_xla_memory(step_fn: StepFn, state: TrainState, images: jax.Array, labels: jax.Array) -> dict[str, int]:
    """XLA's compiled memory analysis of the jitted step: temp (activations kept for backward, workspace)
    and argument bytes. The timed step's own executable, from jit's cache: no second compilation."""
    analysis = step_fn.lower(state, images, labels, jnp.asarray(False)).compile().memory_analysis()  # type: ignore[attr-defined]
    if analysis is None:
        return {}
    return {"xla_temp_bytes": int(analysis.temp_size_in_bytes),
            "xla_argument_bytes": int(analysis.argument_size_in_bytes),
            "xla_output_bytes": int(analysis.output_size_in_bytes)}
