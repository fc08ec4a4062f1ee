"""Twin trainers: the same steps in both frameworks, and each technique doing what it claims.

Small models (ResNet-10 at width 1/8: one block a stage) on a fixture archive, CPU. A finding that shapes these tests:
in fp32, training a BatchNorm ResNet has a rounding noise floor. A ReLU input within rounding of zero
switches sides, and within ~10 SGD steps the loss gap reaches ~1e-3 (measured on ResNet-18), even between torch
and torch with only the memory layout changed (channels_last). So exact-equality claims are proven in the fp64
verification mode (agreement ~1e-10 over 20 steps), and fp32 claims are checked where fp32 can keep them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.workloads import arch
from jax_impl.backend import fit as jax_fit
from torch_impl.backend import fit as torch_fit
from torch_impl.train import export_initial_weights

FITS = {"torch": torch_fit, "jax": lambda config: jax_fit(config.replace(compile="compiled"))}
"""Each framework's fast CPU path: torch eager (torch.compile costs ~20 s a run here) and JAX jit (op by op
is ~50x slower); eager-vs-compiled equality has its own test below."""


@pytest.fixture(scope="session")
def base(cifar100_archive: Path, tmp_path_factory) -> RunConfig:
    # drop_last: 600 images in batches of 32 end in a short one of 24, which every 20-step JAX fit would compile
    # again (3.3 s here); the short batch's recompile has its own test below
    config = RunConfig(data=str(cifar100_archive), model="resnet10", width=0.125, batch_size=32, steps=20,
                       epochs=None, lr=0.05, warmup_steps=3, eval_batches=2, timing_warmup=1, drop_last=True)
    weights = tmp_path_factory.mktemp("weights") / "init.npz"
    export_initial_weights(config, 100, str(weights))
    return config.replace(init_weights=str(weights))


@pytest.fixture(scope="session")
def fitted():
    """Each framework's run of a configuration, made once per worker and shared by the tests that only read it: the
    fp32 run of ``base`` (the fp32 parity test and the four mixed-precision tests compare against it) and the fp64
    BatchNorm run of 3 steps (the accumulation and the checkpointing tests' reference)."""
    runs = {}

    def run(framework: str, config: RunConfig):
        key = (framework, repr(sorted(config.to_dict().items())))
        if key not in runs:
            runs[key] = FITS[framework](config)
        return runs[key]

    return run


FITS_BY_MODE = {"torch": torch_fit, "jax": jax_fit}  # honours config.compile


@pytest.fixture(scope="session")
def short_last_batch(base: RunConfig, tmp_path_factory) -> RunConfig:
    """``base`` (its initial weights) on 56 training images in batches of 16: three full batches and a short one of 8
    in every epoch, so a run's 4th step changes the shape (the 600 images in batches of 128 it replaces made every
    step 8 times the work, op by op in JAX's eager run)."""
    from experiments.catalog.fixtures import write_cifar_archive

    archive = write_cifar_archive(tmp_path_factory.mktemp("cifar100-56"), kind="cifar100", n_train=56, n_test=32,
                                  seed=5)
    return base.replace(data=str(archive), batch_size=16, steps=5, drop_last=False)


def _relative_gaps(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b) / np.abs(b)


@pytest.mark.slow
def test_paired_trajectory_fp64_same_steps_same_accuracy(base):
    config = base.replace(precision="fp64")
    t, j = FITS["torch"](config), FITS["jax"](config)
    assert t.status == j.status == "ok" and len(t.losses) == len(j.losses) == 20
    assert _relative_gaps(j.losses, t.losses).max() < 1e-8
    assert t.eval.accuracy == j.eval.accuracy
    assert abs(t.eval.loss - j.eval.loss) < 1e-8
    assert t.final_lr == pytest.approx(j.final_lr, abs=1e-9)


@pytest.mark.slow
def test_paired_trajectory_fp32_agrees_before_the_noise_floor(base, fitted):
    """fp32: the first steps agree within the issue's 1e-4 (here the drift starts at step 3); later
    steps drift no further apart than torch drifts from itself under a layout change (the noise floor).
    The floor is this machine's own: on another CPU a ReLU may flip sooner, so the first steps are allowed
    the same margin over it (fp64 above is the proof that the steps are the same)."""
    t, j = fitted("torch", base), fitted("jax", base)
    layout = FITS["torch"](base.replace(channels_last=True))
    floor = _relative_gaps(layout.losses, t.losses)
    assert _relative_gaps(j.losses[:3], t.losses[:3]).max() < max(1e-4, 10 * floor[:3].max())
    assert _relative_gaps(j.losses, t.losses).max() < max(10 * floor.max(), 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_accumulating_4_micro_batches_of_8_equals_one_batch_of_32(base, framework, tmp_path):
    """GroupNorm, so micro-batches normalise alone exactly as in the big batch; fp64 for exactness."""
    config = base.replace(norm="group", precision="fp64", steps=4, init_weights=None, eval_batches=None)
    # from torch's GroupNorm weights, as every paired run: without them each JAX run compiled Flax's init (7 s of
    # this test's 56 s here) and cast its values to fp64 op by op
    export_initial_weights(config, 100, str(tmp_path / "group.npz"))
    config = config.replace(init_weights=str(tmp_path / "group.npz"))
    big = FITS[framework](config.replace(batch_size=32))
    accumulated = FITS[framework](config.replace(batch_size=8, grad_accum_steps=4))
    assert _relative_gaps(accumulated.losses, big.losses).max() < 1e-6
    assert accumulated.eval.loss == pytest.approx(big.eval.loss, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_accumulation_with_batchnorm_differs_from_the_big_batch(base, fitted, framework):
    """With BatchNorm each micro-batch is normalised by its own statistics: not the big batch's step."""
    config = base.replace(precision="fp64", steps=3)  # the checkpointing test's plain run
    big = fitted(framework, config)
    accumulated = FITS[framework](config.replace(batch_size=8, grad_accum_steps=4))
    assert _relative_gaps(accumulated.losses, big.losses).max() > 1e-4


def test_linear_lr_scaling_rule(base):
    config = base.replace(grad_accum_steps=4, lr_scale_accum=True)
    assert config.effective_lr == pytest.approx(4 * base.lr)
    assert base.replace(grad_accum_steps=4).effective_lr == base.lr


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_checkpointing_keeps_loss_and_lowers_saved_memory(base, fitted, framework):
    # fp64: recomputation reorders fp32 roundings (XLA fuses the rematerialised graph differently; the
    # eval loss after 3 steps moved by 2e-6 here), which would hide a real difference of that size
    config = base.replace(steps=3, precision="fp64")
    plain = fitted(framework, config)  # the accumulation test's big batch
    remat = FITS[framework](config.replace(remat="all"))
    assert _relative_gaps(remat.losses, plain.losses).max() < 1e-9
    # running statistics are not updated twice by the recomputation: evaluation is unchanged
    assert remat.eval.loss == pytest.approx(plain.eval.loss, rel=1e-9)
    # torch: bytes its saved-tensor hooks see; JAX: bytes of its residuals (XLA:CPU's compiled temp size
    # does not shrink with remat here, so it cannot show the saving on this machine)
    assert remat.memory.saved_for_backward_bytes < 0.5 * plain.memory.saved_for_backward_bytes


def test_checkpointing_gradients_unchanged_torch(base):
    import torch

    from torch_impl.train import make_model

    # fp64, as every exact claim here: in fp32 a recomputed ReLU input within rounding of zero could flip on
    # some CPU and move one gradient by ~1e-2, which says nothing about recomputation itself
    config = base.replace(remat="all", precision="fp64")
    x = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    grads = []
    for stages in ((), (1, 2, 3, 4)):
        model = make_model(config, arch(config, 100)).cpu()
        model.checkpoint_stages = frozenset(stages)
        model(x).logsumexp(1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_checkpointing_gradients_unchanged_jax(base):
    import jax
    import jax.numpy as jnp

    from common.model_options import ModelOptions
    from jax_impl.models import init_variables, make_model

    description = arch(base, 100)
    with jax.enable_x64(True):  # fp64: see the torch twin above
        x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 32, 32, 3)), jnp.float64)
        variables = init_variables(make_model(description), 0)
        variables = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), variables)
        grads = []
        for stages in ((), (1, 2, 3, 4)):
            model = make_model(description, ModelOptions(dtype="float64", remat=stages))

            def loss(params, model=model):
                out, _ = model.apply({**variables, "params": params}, x, train=True, mutable=["batch_stats"])
                return jax.nn.logsumexp(out, axis=1).mean()

            grads.append(jax.jit(jax.grad(loss))(variables["params"]))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12), grads[1], grads[0])


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_compiled_equals_eager_and_a_short_last_batch_recompiles_once(short_last_batch, framework):
    """56 samples in batches of 16: three full batches and a short one of 8, which changes the shape. Both compile
    scopes compute the eager step: the whole update (the default; torch compiles optimizer.step beside the model, its
    graphs counted in the first step's, not as recompiles) and the model alone (JAX: the update op by op). torch
    through the aot_eager backend, which captures and splits the same graphs as inductor gets them, without generating
    code (graphs, guards and recompiles are dynamo's, whatever the backend). Inductor's code for this step is held to
    eager in tests/test_ladder.py's gpu_check test (the ladder's compile rung against its baseline rung: the same
    weights and batches, 3 steps), which pays the suite's one inductor compile of it (34-46 s cold alone here, ~80 s
    beside another test). Measured on ResNet-10: compiled and eager 1.0e-7 apart in JAX (1.1e-7 on ResNet-18), 0 in
    torch (2-core AMD EPYC, 2026-12-07), against 1e-5."""
    if framework == "torch":  # dynamo remembers the sizes a frame has seen: an earlier test's would change the count
        import torch._dynamo

        torch._dynamo.reset()
    config = short_last_batch
    eager = FITS_BY_MODE[framework](config.replace(steps=3))  # op by op JAX is slow: the 3 full batches compared
    traced = config.replace(compile="compiled", torchcompile_backend="aot_eager")  # JAX: jit, its one compiler
    compiled = FITS_BY_MODE[framework](traced)
    assert config.compile_scope == "step"
    assert _relative_gaps(compiled.losses[:3], eager.losses[:3]).max() < 1e-5
    assert compiled.recompiles == 1 and eager.recompiles == 0 and compiled.steps_done == 5
    dropped = FITS_BY_MODE[framework](traced.replace(compile_scope="model", drop_last=True))
    assert dropped.recompiles == 0 and dropped.steps_done == 5
    assert _relative_gaps(dropped.losses[:3], eager.losses[:3]).max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_follows_fp32(base, fitted, framework, precision):
    """Stated tolerance: over 20 steps every loss within 5% of the fp32 run's (bf16 keeps ~3 significant
    digits; the fp32 noise floor alone reaches ~1e-2 here)."""
    # torch's fp16 on a CPU runs emulated kernels (119 s for this case at batch 32 beside another xdist worker): its
    # case runs at batch 8, against torch's fp32 at batch 8 (a second or two)
    emulated = (framework, precision) == ("torch", "fp16")
    config = base.replace(batch_size=8) if emulated else base
    reference = fitted(framework, config)
    mixed = FITS[framework](config.replace(precision=precision))
    assert mixed.status == "ok"
    gaps = _relative_gaps(mixed.losses, reference.losses)
    if not emulated:
        assert gaps.max() < 0.05
    else:  # batch 8's own noise floor is higher: a 0.2% change of the LR alone moved one fp32 loss of 20 by 7.3%
        # (AMD EPYC, 2026-12-06; fp16 itself: max 5.9%, mean 1.6%), so every loss within 10%, on average within 3%
        assert gaps.max() < 0.10 and gaps.mean() < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_fp16_loss_scaler_skips_an_injected_inf_and_recovers(base, framework):
    # The scale's rules do not depend on the batch. torch: 8 steps at batch 8 (its fp16 on a CPU is emulated: 55 s
    # at batch 32). JAX: the fp16 mixed-precision test's batch and steps, so the two run one compiled program (the
    # scale's settings and the injected inf are values, not constants of it): 28.5 s of its own here before
    sized = base.replace(steps=8, batch_size=8) if framework == "torch" else base
    config = sized.replace(precision="fp16", inject_inf_at_step=2, loss_scale_init=1024.0, loss_scale_growth_interval=3)
    result = FITS[framework](config)
    scales = result.loss_scales  # the scale after each step
    assert result.status == "ok" and all(np.isfinite(result.losses))
    assert scales[:2] == [1024.0, 1024.0]
    assert scales[2] == 512.0  # halved, step skipped
    assert scales[5] == 1024.0  # three good steps later it grows again
    # the skipped step left the schedule where it was: of its steps, all but one real updates
    steps_taken = RunConfig.from_dict({**config.to_dict(), "inject_inf_at_step": None, "precision": "fp32"})
    from common.schedule import learning_rate

    total = config.steps
    assert len(scales) == total
    assert result.final_lr == pytest.approx(float(learning_rate(total - 1, steps_taken, total, np)), rel=1e-6)


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])  # JAX: 10.6 s
def test_a_diverging_run_is_recorded_as_diverged(base, framework):
    result = FITS[framework](base.replace(lr=1e6, warmup_steps=0, steps=10))
    assert result.status == "diverged"
    last, first = result.losses[-1], result.losses[0]
    assert (not np.isfinite(last) or last > 100 * first) and len(result.losses) < 10  # stopped at once
    assert result.eval is None


@pytest.mark.slow
@pytest.mark.e2e
def test_resume_after_a_killed_process_continues_the_same_curve(base, tmp_path):
    """torch's checkpoints (torch.save, atomic). JAX's (orbax: the same save and load whatever the process count)
    are killed and resumed in tests/test_parallel.py's
    test_jax_on_two_processes_killed_and_resumed_ends_where_one_device_does (2 processes: a stricter case of the same
    code); the resume offset itself is a loop rule (tests/test_loop.py)."""
    from experiments.execution.paired import run_framework

    framework = "torch"
    config = base.replace(steps=10, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=4)
    full = run_framework(framework, config.replace(checkpoint_dir=str(tmp_path / "full")))
    killed = run_framework(framework, config.replace(fail_after_step=6))
    assert killed.status == "failed" and "exit code 9" in killed.error
    resumed = run_framework(framework, config.replace(resume=True))
    assert resumed.status == "ok" and resumed.start_step == 4
    assert _relative_gaps(resumed.losses, full.losses[4:]).max() < 1e-6
    assert resumed.eval.accuracy == full.eval.accuracy


def test_a_jax_checkpoint_of_another_state_is_refused_and_named(tmp_path):
    """A checkpoint whose state has another shape (here: the loss scale before its growth interval joined the state)
    is a ConfigError naming the checkpoint and what is missing, not orbax's bare ValueError."""
    from typing import NamedTuple

    import jax.numpy as jnp

    from common.errors import ConfigError
    from jax_impl import checkpoint
    from jax_impl.amp import LossScale

    class OlderLossScale(NamedTuple):
        scale: object
        good_steps: object

    params = {"w": jnp.ones(3)}
    older = OlderLossScale(jnp.ones(()), jnp.zeros((), jnp.int32))
    path = checkpoint.save(tmp_path, 4, checkpoint.TrainState(params, {}, (), older))
    like = checkpoint.TrainState(params, {}, (), LossScale.create(RunConfig(precision="fp16")))
    with pytest.raises(ConfigError, match=r"checkpoint .*jax_step_00000004 does not hold this run's state"
                                          r".*growth_interval"):
        checkpoint.load(path, like)
    assert checkpoint.load(checkpoint.save(tmp_path / "now", 4, like), like).loss_scale.growth_interval == 2000
