"""The Vision Transformer twin through the real trainers (torch_impl.backend.fit, jax_impl.backend.fit): the same
steps in both frameworks, and each technique keeping its claim on a transformer (tests/test_trainers.py is the
ResNet's twin of this file; tests/test_parallel.py its data-parallel one).

vit-micro (64 wide, 2 blocks, 2 heads) on the 10-class fixture archive, CPU, batches of 16. A ViT has no BatchNorm
and no ReLU, so unlike the ResNet it has no per-batch statistics and no rounding-sized sign flips: in fp64 both
frameworks take the same 20 steps to ~4e-16 here, and accumulation, rematerialisation and data parallelism are
exact to the same order. The bars below are the issue's 1e-9; anything that is not fp64 rounding (an fp32 softmax,
an fp32 learning rate) lands well above it (1e-9..4e-8 when found here).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import train, weight_gap

from common.config import RunConfig
from jax_impl.backend import fit as jax_fit
from torch_impl.backend import fit as torch_fit
from torch_impl.train import export_initial_weights

CLASSES = 10
EXACT = 1e-9  # the bar for fp64 agreement

FITS = {"torch": torch_fit, "jax": lambda config: jax_fit(config.replace(compile="compiled"))}
"""Each framework's fast CPU path: torch eager and JAX jit; eager-vs-compiled equality has its own test below."""
FITS_BY_MODE = {"torch": torch_fit, "jax": jax_fit}  # honours config.compile


def _with_initial_weights(config: RunConfig, folder: Path) -> RunConfig:
    """``config`` starting from torch's initial weights for its architecture (cls or mean pooling differ)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"init-{config.model}-{config.pool}.npz"
    export_initial_weights(config, CLASSES, str(path))
    return config.replace(init_weights=str(path))


@pytest.fixture(scope="session")
def base(cifar10_archive: Path, tmp_path_factory) -> RunConfig:
    # SGD at 0.2 (AdamW below at 3e-3): the 20 steps reach ~0.26 (~0.57) accuracy on the 100 test images, so
    # "the same accuracy" compares a model that has learned, not two chance-level ones
    config = RunConfig(model="vit-micro", source="cifar10", data=str(cifar10_archive), batch_size=16, steps=20,
                       epochs=None, lr=0.2, warmup_steps=3, eval_batches=None, timing_warmup=1)
    return _with_initial_weights(config, tmp_path_factory.mktemp("vit-weights"))


def _relative_gaps(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b) / np.abs(b)


@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {"optimizer": "adamw", "lr": 3e-3},  # ViTs train with AdamW; fused attention, class-token pooling
    {"attention": "naive", "pool": "mean"},  # the default SGD; written-out attention, mean pooling
], ids=["adamw-fused-cls", "sgd-naive-mean"])
def test_paired_trajectory_fp64_same_steps_same_accuracy(base, tmp_path, changes):
    """The issue's claim: 20 steps from the same weights on the same batches, every loss within 1e-9.
    It failed on two defects, both fixed: jax.nn.dot_product_attention's softmax is fp32 even for fp64 inputs (AdamW
    turned the zero gradient of the key bias into a 2e-6 weight gap; losses 1e-8 apart), and the LR formula ran in
    fp32, where numpy's and XLA's cos differ by an ulp at some steps (losses 3e-9..5e-9 apart from then on)."""
    config = base.replace(precision="fp64", **changes)
    if config.pool != base.pool:
        config = _with_initial_weights(config, tmp_path)
    t, j = FITS["torch"](config), FITS["jax"](config)
    assert t.status == j.status == "ok" and len(t.losses) == len(j.losses) == 20
    assert _relative_gaps(j.losses, t.losses).max() < EXACT
    assert t.losses[-1] < t.losses[0]  # it trains
    assert t.eval.accuracy == j.eval.accuracy and t.eval.accuracy > 2 / CLASSES  # learned beyond chance
    assert abs(t.eval.loss - j.eval.loss) < EXACT
    assert t.final_lr == pytest.approx(j.final_lr, rel=1e-12)
    if config.attention == "naive":  # the kernel asked for is the kernel that ran, on both sides
        assert any("attention: naive" in note for note in t.notes) and any("attention: naive" in n for n in j.notes)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_accumulating_2_micro_batches_of_8_equals_one_batch_of_16(base, framework, tmp_path):
    """No BatchNorm in a ViT: every sample is normalised on its own, so the accumulated step is the big batch's
    (in fp64 to rounding: summation order alone differs). JAX's optax.MultiSteps accumulated in fp32 by default
    (final weights 6e-9 apart), now in the parameters' dtype."""
    config = base.replace(precision="fp64", steps=4)  # the whole test split: batch sizes differ, samples do not
    big = FITS[framework](config.replace(save_weights=str(tmp_path / "big.npz")))
    accumulated = FITS[framework](config.replace(batch_size=8, grad_accum_steps=2,
                                                 save_weights=str(tmp_path / "accumulated.npz")))
    assert len(accumulated.losses) == len(big.losses) == 4  # one loss per optimizer step
    assert _relative_gaps(accumulated.losses, big.losses).max() < EXACT
    assert accumulated.eval.loss == pytest.approx(big.eval.loss, rel=EXACT)
    assert weight_gap(dict(np.load(tmp_path / "big.npz")), dict(np.load(tmp_path / "accumulated.npz"))) < EXACT


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_remat_of_attention_or_blocks_keeps_fp64_losses_and_lowers_saved_memory(base, framework):
    """Recomputing is the same function: fp64 losses unchanged. Saved bytes: torch's saved-tensor hooks, JAX's
    residuals (measured here: every block whole saves ~0.1x, every attention sublayer ~0.77x of none)."""
    config = base.replace(precision="fp64", steps=3, eval_batches=2)
    runs = {remat: FITS[framework](config.replace(remat=remat)) for remat in ("none", "attention", "all")}
    plain = runs["none"]
    for remat in ("attention", "all"):
        assert _relative_gaps(runs[remat].losses, plain.losses).max() < EXACT, remat
        assert runs[remat].eval.loss == pytest.approx(plain.eval.loss, rel=EXACT), remat
    saved = {remat: run.memory.saved_for_backward_bytes for remat, run in runs.items()}
    assert saved["all"] < 0.3 * saved["none"], saved
    assert saved["all"] < saved["attention"] < 0.9 * saved["none"], saved


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_compiled_equals_eager(base, framework):
    """torch.compile and jax.jit against op-by-op execution, fp32, the first 2 steps (JAX op by op is slow). torch
    compiles the model alone (a cold compile of 2 steps: 33 s, against 43 s with the SGD update compiled beside it,
    2 cores beside another test, 2026-12-06); the whole update compiled equal to eager: through inductor, the ResNet's
    in tests/test_ladder.py's gpu_check test; through aot_eager, tests/test_trainers.py's."""
    config = base.replace(steps=2, eval_batches=1)
    eager = FITS_BY_MODE[framework](config)
    scope = "model" if framework == "torch" else "step"
    compiled = FITS_BY_MODE[framework](config.replace(compile="compiled", compile_scope=scope))
    assert eager.graphs_compiled == 0 and compiled.graphs_compiled >= 1  # the compiled path really compiled
    assert _relative_gaps(compiled.losses, eager.losses).max() < 1e-5


MIXED_STEPS = 10  # bf16 matmuls are slow on a CPU


@pytest.fixture(scope="session")
def fp32_reference(base):
    """Each framework's fp32 run of ``base``, shared by the mixed-precision cases."""
    cache: dict[str, object] = {}

    def get(framework: str):
        if framework not in cache:
            cache[framework] = FITS[framework](base.replace(steps=MIXED_STEPS))
        return cache[framework]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "precision"), [("torch", "bf16"), ("jax", "bf16"), ("jax", "fp16")])
def test_mixed_precision_follows_fp32(base, fp32_reference, framework, precision):
    """Stated tolerance: every one of the 10 losses within 5% of the fp32 run's (seen here: <0.6%). fp16 in JAX
    failed to compile on a CPU before (jax.nn.dot_product_attention's F16_F16_F32 dot; jax_impl/transformer.py);
    torch's fp16 (GradScaler) is the ResNet's, tests/test_trainers.py, and slow on a CPU."""
    reference = fp32_reference(framework)
    mixed = FITS[framework](base.replace(precision=precision, steps=MIXED_STEPS))
    assert reference.status == mixed.status == "ok", mixed.error
    assert _relative_gaps(mixed.losses, reference.losses).max() < 0.05


@pytest.fixture(scope="session")
def one_process(base, tmp_path_factory):
    """framework -> (losses, final weights) of one process on the global batch of 16, fp64, 10 steps."""
    folder = tmp_path_factory.mktemp("vit-one-process")
    config = base.replace(precision="fp64", steps=10, eval_batches=1)
    cache: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def get(framework: str):
        if framework not in cache:
            path = folder / f"{framework}.npz"
            result = FITS[framework](config.replace(save_weights=str(path)))
            assert result.status == "ok"
            cache[framework] = (np.asarray(result.losses), dict(np.load(path)))
        return config, *cache[framework]

    return get


@pytest.mark.slow
@pytest.mark.multiprocess
def test_jax_sharding_on_two_host_devices_equals_one_device(one_process, tmp_path):
    """jit + NamedSharding over 2 XLA host devices (its own process, XLA_FLAGS asking for them), 8 images each
    (torch DDP of a ViT: tests/test_parallel.py, parametrized over the families).
    shard_map and pmap are the ResNet's, tests/test_parallel.py (they agree for the ViT too: 2e-16 when tried)."""
    config, one_loss, one = one_process("jax")
    par_loss, par = train("jax", config.replace(batch_size=8, devices=2, compile="compiled", jax_parallel="sharding"),
                          tmp_path / "sharding.npz")
    assert len(par_loss) == len(one_loss) == 10
    assert np.abs(par_loss - one_loss).max() < EXACT
    assert weight_gap(one, par) < EXACT
