"""The JAX trainer. torch_impl/train.py exposes the same functions with the same roles:
make_model, make_optimizer, make_train_step, evaluate, fit."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.arch import ResNetArch
from common.config import RunConfig, learning_rate, loader_options, open_sources
from common.data.batches import grouped
from common.metrics import is_diverged
from common.timing import StepTimer
from common.weights import load_torch_keyed, torch_to_flax
from jax_impl import checkpoint as ckpt
from jax_impl import parallel, pipeline
from jax_impl.data import make_loader
from jax_impl.models import ResNet, init_variables
from jax_impl.models import make_model as build_resnet
from jax_impl.profiling import StepProfiler
from jax_impl.techniques import (
    LossScale,
    all_finite,
    apply_flags,
    compute_dtype,
    param_dtype,
)


class TrainState(NamedTuple):
    params: Any
    batch_stats: Any
    opt_state: Any
    loss_scale: LossScale


StepFn = Callable[[TrainState, jax.Array, jax.Array, jax.Array], tuple[TrainState, jax.Array]]


def make_model(config: RunConfig, arch: ResNetArch) -> tuple[ResNet, dict[str, Any]]:
    model = build_resnet(arch, dtype=compute_dtype(config), checkpoint_stages=config.checkpoint_stages,
                         checkpoint_policy=config.checkpoint_policy, bn_axis_name=parallel.bn_axis_name(config))
    def init() -> dict[str, Any]:
        return init_variables(model, jax.random.key(config.seed), config.image_size)

    if config.init_weights:  # the same initial weights as the torch run (torch-keyed .npz): shapes suffice
        variables = torch_to_flax(load_torch_keyed(config.init_weights), jax.eval_shape(init))
    else:  # jitted: run op by op, Flax's init compiles every primitive on its own (9.5 s for a small ResNet)
        variables = jax.jit(init)()
    variables = jax.tree.map(lambda a: jnp.asarray(a, param_dtype(config)), dict(variables))
    return model, variables


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
        tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps)
    return tx


def loss_fn(config: RunConfig, logits: jax.Array, labels: jax.Array, num_classes: int) -> jax.Array:
    # Softmax and loss stay fp32 (fp64 in the verification mode) whatever the compute dtype
    # (torch: F.cross_entropy with label_smoothing).
    dtype = param_dtype(config)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes, dtype=dtype), config.label_smoothing)
    return optax.softmax_cross_entropy(logits.astype(dtype), targets).mean()


def make_train_step(config: RunConfig, model: ResNet, tx: optax.GradientTransformation, num_classes: int) -> StepFn:
    """One micro-batch step (with MultiSteps, every k-th call updates the parameters). fp16 scales the
    loss, unscales the gradients and, if any is inf/nan, keeps parameters and optimizer state."""
    fp16 = config.precision == "fp16"

    def step(state: TrainState, images: jax.Array, labels: jax.Array, inject_inf: jax.Array):
        def scaled_loss(params):
            logits, updates = model.apply({"params": params, "batch_stats": state.batch_stats}, images,
                                          train=True, mutable=["batch_stats"])
            loss = loss_fn(config, logits, labels, num_classes)
            return loss * state.loss_scale.scale, (loss, updates.get("batch_stats", state.batch_stats))

        (_, (loss, batch_stats)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(parallel.per_replica(config, state.params))
        grads, loss, batch_stats = parallel.reduce_across_replicas(config, grads, loss, batch_stats)
        grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
        # Test hook: an overflowing gradient, as fp16 produces.
        leaves, treedef = jax.tree.flatten(grads)
        grads = jax.tree.unflatten(treedef, [jnp.where(inject_inf, jnp.inf, leaves[0])] + leaves[1:])
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

    if config.devices > 1:
        return step  # the caller makes it data parallel (jax_impl/parallel.py)
    if config.compile == "compiled":
        return jax.jit(step, donate_argnums=(0,))  # donated: the old state's buffers are reused in place
    return step


def _eval_logits(model: ResNet) -> Callable:
    return lambda variables, images: model.apply(variables, images, train=False)


def evaluate(config: RunConfig, model: ResNet, state: TrainState, loader) -> dict[str, float]:
    # Always jitted: evaluation is not timed, and op by op it would compile every primitive again (~5 s).
    logits_fn = jax.jit(_eval_logits(model))
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    correct, seen, loss_sum = 0, 0, 0.0
    with _mode(config):
        for number, (images, labels) in enumerate(loader.epoch(0)):
            if config.eval_batches is not None and number >= config.eval_batches:
                break
            logits = logits_fn(variables, images).astype(param_dtype(config))
            loss_sum += float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum())
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
    return {"accuracy": correct / seen, "loss": loss_sum / seen, "samples": seen}


def _mode(config: RunConfig) -> contextlib.AbstractContextManager:
    """Eager = op by op: JAX's equivalent of torch eager mode (every op dispatched on its own)."""
    return jax.disable_jit() if config.compile == "eager" else contextlib.nullcontext()


def _micro_batches(loader, config: RunConfig, epoch: int, start_step: int) -> Iterator[list]:
    """The epoch's steps from ``start_step`` on, each a list of k micro-batches."""
    return grouped(loader.epoch(epoch, start_batch=start_step * config.grad_accum_steps), config.grad_accum_steps)


def measure_saved_bytes(config: RunConfig, model: ResNet, state: TrainState, images: jax.Array, labels: jax.Array) -> int:
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

    # Saved weights count too, as they do in torch's hooks.
    return int(sum(np.prod(aval.shape) * aval.dtype.itemsize for aval, _ in saved_residuals(loss, state.params)))


def measure_xla_memory(step_fn: StepFn, state: TrainState, images: jax.Array, labels: jax.Array) -> dict[str, int]:
    """XLA's compiled memory analysis of the jitted step: temp (activations kept for backward, workspace)
    and argument bytes. The timed step's own executable, from jit's cache: no second compilation."""
    analysis = step_fn.lower(state, images, labels, jnp.asarray(False)).compile().memory_analysis()  # type: ignore[attr-defined]
    if analysis is None:
        return {}
    return {"xla_temp_bytes": int(analysis.temp_size_in_bytes), "xla_argument_bytes": int(analysis.argument_size_in_bytes),
            "xla_output_bytes": int(analysis.output_size_in_bytes)}


def fit(config: RunConfig) -> dict[str, Any]:
    """Trains per ``config``; returns losses, timing, memory, evaluation and notes (one result row)."""
    parallel.start(config)  # joins jax.distributed first when the run spans processes
    with jax.enable_x64(config.precision == "fp64"):
        return _fit(config)


def _fit(config: RunConfig) -> dict[str, Any]:
    notes = apply_flags(config)
    data_parallel = parallel.DataParallel.create(config)  # None on one device
    train_source, test_source = open_sources(config)
    arch = config.arch(train_source.num_classes)
    # Each process reads its slice of the global batch (batch_size per replica, as in DDP): the whole of it when
    # there is one process, and lays it out over its devices.
    local_batch = config.batch_size * config.devices // config.processes
    train_loader = make_loader(train_source, loader_options(config.replace(batch_size=local_batch), train=True,
                                                            rank=jax.process_index(), world_size=config.processes))
    eval_loader = make_loader(test_source, loader_options(config, train=False))
    steps_per_epoch = len(train_loader) // config.grad_accum_steps
    if steps_per_epoch == 0:
        raise ValueError(f"an epoch of {len(train_loader)} batches holds no step of {config.grad_accum_steps} micro-batches")
    total_steps = config.steps or config.epochs * steps_per_epoch  # type: ignore[operator]

    model, variables = make_model(config, arch)
    tx = make_optimizer(config, total_steps)
    state = TrainState(variables["params"], variables.get("batch_stats", {}), tx.init(variables["params"]),
                       LossScale.create(config))
    if config.pipeline_stages > 1:
        mesh = pipeline.make_mesh(config)
        step_fn = pipeline.make_train_step(config, model, tx, mesh, lambda logits, labels: loss_fn(config, logits, labels, arch.num_classes),
                                           TrainState)
        notes += pipeline.notes(config)
    else:
        step_fn = make_train_step(config, model, tx, arch.num_classes)
    if data_parallel is not None:
        step_fn = data_parallel.parallelize(step_fn)
        notes += data_parallel.notes()

    start = 0
    if config.resume and config.checkpoint_dir and (path := ckpt.latest(config.checkpoint_dir)):
        state = TrainState(*ckpt.load(path, state))
        start = ckpt.step_of(path)
        notes.append(f"resumed from step {start}")

    if data_parallel is not None:
        state = data_parallel.place_state(state)
    if config.pipeline_stages > 1:
        state = pipeline.place(mesh, state)
    timer = StepTimer(config.timing_warmup)
    losses: list[float] = []
    loss_scales: list[float] = []
    evals: list[dict[str, Any]] = []
    status, step = "ok", start
    updates_applied = start  # optimizer updates (an fp16 step skipped on overflow is none), as torch's scheduler counts
    first_batch = None
    clock = time.perf_counter
    profiler: StepProfiler | None = None
    while step < total_steps and status == "ok":
        epoch, offset = divmod(step, steps_per_epoch)
        batches = _micro_batches(train_loader, config, epoch, offset)
        while step < total_steps:
            if config.profile_steps and profiler is None and step >= total_steps - config.profile_steps:
                profiler = StepProfiler(config.profile_dir)  # type: ignore[arg-type]
                profiler.start()
            t0 = clock()
            group = next(batches, None)
            if group is None:
                break
            jax.block_until_ready(group)
            t1 = clock()
            inject = jnp.asarray(config.inject_inf_at_step == step)
            total = 0.0
            with _mode(config):
                for images, labels in group:
                    if data_parallel is not None:
                        images, labels = data_parallel.place_batch(images, labels)
                        state, loss = step_fn(state, images, labels, inject)
                        loss = data_parallel.loss_value(loss)
                    else:
                        state, loss = step_fn(state, images, labels, inject)
                    total += loss
            value = float(jax.block_until_ready(total)) / len(group)
            t2 = clock()
            if profiler is None:
                timer.record(t1 - t0, t2 - t1, sum(len(y) for _, y in group) * config.processes)  # global images
            else:  # traced steps are slower: kept out of the steady-state statistics
                profiler.step()
            if first_batch is None:
                first_batch = group[0]
            losses.append(value)
            scale = float(np.asarray(state.loss_scale.scale).reshape(-1)[0])  # pmap: one per replica, all equal
            previous = loss_scales[-1] if loss_scales else float(LossScale.create(config).scale)
            updates_applied += 0 if scale < previous else 1  # a halved scale means the step was skipped
            loss_scales.append(scale)
            step += 1
            if is_diverged(value, losses[0]):
                status = "diverged"
                break
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                # Orbax writes a replicated global array once, from process 0, when every process calls save.
                saved = data_parallel.gather_state(state) if data_parallel is not None and config.processes == 1 else state
                ckpt.save(config.checkpoint_dir, step, saved)  # type: ignore[arg-type]
            if config.fail_after_step == step:
                os._exit(9)  # test hook: die like a killed process, no clean-up
            if config.eval_every and step % config.eval_every == 0 and step < total_steps:
                evals.append({"step": step, **evaluate(config, model, state, eval_loader)})

    profile = profiler.stop() if profiler is not None else None
    if data_parallel is not None:
        state = data_parallel.gather_state(state)
    cache_size = getattr(step_fn, "_cache_size", None)  # jit's count of compiled shapes (pmap has none)
    compiled_shapes = cache_size() if config.compile == "compiled" and cache_size else 0
    result: dict[str, Any] = {"framework": "jax", "status": status, "steps_done": step, "start_step": start,
                              "losses": losses, "loss_scales": loss_scales, "timing": timer.summary(),
                              "recompiles": max(compiled_shapes - 1, 0), "graphs_compiled": compiled_shapes,
                              "notes": notes, "device": str(jax.devices()[0]), "jax": jax.__version__,
                              "final_lr": float(learning_rate(updates_applied, config, total_steps, np))}
    if status == "ok":
        final = evaluate(config, model, state, eval_loader)
        evals.append({"step": step, **final})
        result["eval"] = final
    result["evals"] = evals
    memory: dict[str, Any] = {}
    if first_batch is not None and status == "ok":
        if data_parallel is None:  # both measure the single-device step
            memory["saved_for_backward_bytes"] = measure_saved_bytes(config, model, state, *first_batch)
            if config.compile == "compiled":  # op by op there is no whole-step program to analyse
                memory.update(measure_xla_memory(step_fn, state, *first_batch))
        stats = jax.local_devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            memory["peak_allocated_bytes"] = int(stats["peak_bytes_in_use"])
    result["memory"] = memory
    result["synthetic_data"] = train_source.synthetic
    result["replicas"] = config.devices
    result["processes"] = config.processes
    result["process_index"] = jax.process_index()  # process 0 speaks for the run
    if config.save_weights and status == "ok" and parallel.is_main_process():
        from common.weights import flax_to_torch, save_torch_keyed

        save_torch_keyed(config.save_weights, flax_to_torch({"params": state.params, "batch_stats": state.batch_stats}))
    if profile is not None:
        result["profile"] = profile
    return result
