"""The Vision Transformer twins compute the same thing: same weights and batch give the same logits and gradients
(fp32 at the issue's tolerances, fp64 at 1e-9), both attention kernels; weights transfer both ways exactly; the
known traps (erf GELU, LayerNorm epsilon and variance, init) are really set; gradient checkpointing changes memory,
not results; and the mixed-precision rules (softmax in fp32) keep attention finite where a half-precision softmax
overflows."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

from common.arch_encoder import EncoderArch, RematPlan, vit
from common.model_options import ModelOptions
from common.weights import flax_to_torch, torch_to_flax
from experiments.execution.parity import (
    TOLERANCES,
    Quantities,
    compare,
    forward_backward,
    load_flax_into_torch,
    max_relative_difference,
)
from jax_impl import transformer as flax_vit
from jax_impl.models import init_variables
from torch_impl import transformer as torch_vit
from torch_impl.train import _count_saved_bytes as count_saved_bytes

POOLS = ("cls", "mean")
KERNELS = ("naive", "fused")
TRUNC_STD = 0.02 * 0.8796  # a normal of std 0.02 truncated at +-2 std: sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.8796


def micro(pool: str = "cls", classes: int = 10) -> EncoderArch:
    return vit("vit-micro", num_classes=classes, pool=pool)


@cache
def flax_template(arch: EncoderArch) -> dict:
    """Shapes and dtypes of Flax's variables: enough for the weight transfer. (A real Flax init compiles a random
    generator per weight, seconds on a small CPU: only the initialisation test pays for one.)"""
    return jax.eval_shape(lambda: init_variables(flax_vit.make_model(arch), 0, arch.image_size))


def torch_weights_for_flax(model: torch.nn.Module, arch: EncoderArch, dtype=np.float32) -> dict:
    template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, dtype), flax_template(arch))
    return torch_to_flax(model.state_dict(), template)


@cache
def paired(pool: str, kernel: str, float64: bool) -> tuple[Quantities, Quantities]:
    """(torch, Flax) logits, loss and gradients on the same torch-initialised weights and batch; cached, as the
    kernel comparison below reuses them (the weights do not depend on the kernel: the same seed)."""
    return forward_backward(micro(pool), batch_size=4, image_size=32, seed=1, float64=float64, attention=kernel)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("pool", POOLS)
def test_fp32_logits_and_gradients_match(pool, kernel):
    """fp32 at the issue's tolerances directly: no ReLU to flip and no BatchNorm stack, so unlike the ResNet no
    noise floor is needed (measured: logits ~5e-7, gradients ~2e-6)."""
    torch_side, flax_side = paired(pool, kernel, False)
    results = compare(flax_side, torch_side)
    for quantity, value in results.items():
        assert value <= TOLERANCES[quantity], f"{quantity}: {value:.2e} > {TOLERANCES[quantity]:.0e}"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("pool", POOLS)
def test_float64_semantics_are_identical(pool, kernel):
    """Any gap above 1e-9 is a real difference (measured ~1e-15). This caught two fp32 steps inside fp64 passes:
    torch's naive softmax cast the scores to fp32, and jax.nn.dot_product_attention's XLA implementation rounds its
    softmax input to fp32 whatever the input dtype (both fixed: 1e-8 gaps before)."""
    torch_side, flax_side = paired(pool, kernel, True)
    results = compare(flax_side, torch_side)
    assert max(results.values()) < 1e-9, results
    assert flax_side.gradients["blocks.0.attn.qkv.weight"].dtype == np.float64


@pytest.mark.parametrize("pool", POOLS)
def test_naive_and_fused_attention_agree_in_each_framework(pool):
    for side in (0, 1):  # torch, Flax
        naive, fused = paired(pool, "naive", False)[side], paired(pool, "fused", False)[side]
        results = compare(fused, naive)
        assert max(results.values()) <= 1e-5, (side, results)


def _torch_model(arch: EncoderArch, seed: int = 0, **kwargs) -> torch_vit.Encoder:
    torch.manual_seed(seed)
    return torch_vit.make_model(arch, ModelOptions(**kwargs))


@pytest.mark.parametrize("pool", POOLS)
def test_transfer_round_trips_exactly_both_ways(pool):
    arch = micro(pool)
    model = _torch_model(arch)
    state = model.state_dict()
    variables = torch_weights_for_flax(model, arch)  # torch -> Flax -> torch
    back = flax_to_torch(variables)
    assert set(back) == set(state)  # key sets equal (cls_token only with the cls pool)
    assert ("cls_token" in state) == (pool == "cls")
    for key, value in back.items():
        np.testing.assert_array_equal(value, state[key].numpy(), err_msg=key)
    rng = np.random.default_rng(0)  # Flax -> torch -> Flax, from values torch never drew
    flax_side = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), flax_template(arch))
    other = _torch_model(arch, seed=1)
    load_flax_into_torch(other, flax_side)
    again = torch_to_flax(other.state_dict(), flax_side)
    jax.tree.map(np.testing.assert_array_equal, again, flax_side)
    assert not np.array_equal(again["params"]["head"]["kernel"], variables["params"]["head"]["kernel"])


@pytest.mark.parametrize("name,pool", [("vit-micro", "cls"), ("vit-micro", "mean"), ("vit-s", "cls")])
def test_parameter_counts_equal_and_as_designed(name, pool):
    arch = vit(name, num_classes=100, pool=pool)
    w, h, p = arch.width, arch.hidden, arch.patch
    block = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (w * h + h) + (h * w + w)  # 2 norms, qkv, proj, fc1, fc2
    expected = (3 * p * p * w + w) + (w if pool == "cls" else 0) + arch.tokens * w + arch.depth * block + 2 * w + \
        (w * arch.num_classes + arch.num_classes)
    flax_count = sum(math.prod(x.shape) for x in jax.tree.leaves(flax_template(arch)["params"]))
    with torch.device("meta"):  # shapes only: no initialisation of vit-s's 21M weights
        torch_count = sum(p.numel() for p in torch_vit.make_model(arch).parameters())
    assert flax_count == torch_count == expected


def test_initialisation_distributions_match():
    """Both sides draw every weight from a normal of std 0.02 truncated at +-2 std (timm's ViT); biases 0,
    LayerNorm scales 1. The max |w| check fails for an untruncated draw (~4 std over thousands of samples)."""
    arch = micro(classes=100)
    torch_state = _torch_model(arch).state_dict()
    model = flax_vit.make_model(arch)  # jitted: eagerly, every op compiles on its own
    flax_state = flax_to_torch(init_variables(model, 0, 32))
    for key in ("blocks.0.attn.qkv.weight", "blocks.1.mlp.fc1.weight", "pos_embed", "patch_embed.weight",
                "head.weight"):
        t, f = torch_state[key].numpy(), flax_state[key]
        assert f.shape == t.shape, key
        for values in (t, f):
            assert abs(values.std() / TRUNC_STD - 1) < 0.05, key
            assert 0.9 * 0.04 < np.abs(values).max() <= 0.04 + 1e-7, key
    for key in ("blocks.0.attn.qkv.bias", "blocks.1.mlp.fc2.bias", "head.bias", "norm.bias", "blocks.0.norm1.bias"):
        assert not torch_state[key].any() and not flax_state[key].any(), key
    for key in ("norm.weight", "blocks.1.norm2.weight"):
        assert (torch_state[key].numpy() == 1).all() and (flax_state[key] == 1).all(), key


def test_gelu_is_exact_erf_on_both_sides():
    """Flax's nn.gelu defaults to the tanh approximation, torch's to erf. Pre-activations of a few units (where the
    two differ by up to ~5e-4) through both MLPs in fp64: they agree to rounding, and the tanh variant is shown to
    differ by far more than that, so a tanh GELU on either side fails here."""
    arch = micro()
    torch.manual_seed(0)
    mlp = torch_vit.Mlp(arch).double()
    params = {"params": {name: {"kernel": layer.weight.detach().numpy().T, "bias": layer.bias.detach().numpy()}
                         for name, layer in (("fc1", mlp.fc1), ("fc2", mlp.fc2))}}
    x = np.random.default_rng(0).normal(size=(8, arch.width)) * 20  # fc1 outputs of std ~3
    with torch.no_grad():
        expected = mlp(torch.from_numpy(x)).numpy()
        tanh = mlp.fc2(F.gelu(mlp.fc1(torch.from_numpy(x)), approximate="tanh")).numpy()
        assert mlp.fc1(torch.from_numpy(x)).abs().max() > 5
    with jax.enable_x64(True):
        got = np.asarray(flax_vit.Mlp(arch, dtype=jnp.float64).apply(params, jnp.asarray(x)))
    assert max_relative_difference(got, expected) < 1e-12
    assert max_relative_difference(tanh, expected) > 1e-5


def test_layer_norm_epsilon_and_variance_match_torch():
    """Every LayerNorm on both sides takes arch.norm_eps (set to a non-default value here, so a hard-coded 1e-6 or
    either framework's default fails); Flax's uses torch's two-pass variance: with its default E[x^2] - E[x]^2 a
    token of mean 1000 and spread 1 loses its variance to fp32 cancellation (shown below) and the two sides
    disagree by percents."""
    arch = replace(micro(), norm_eps=1e-3)
    model = torch_vit.make_model(arch)
    eps = [m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert eps == [1e-3] * (2 * arch.depth + 1)
    flax_model = flax_vit.make_model(arch)
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, fnn.LayerNorm):
            seen.append((context.module.epsilon, context.module.use_fast_variance))
        return next_fun(*args, **kwargs)

    with fnn.intercept_methods(record):  # init calls every module; eval_shape traces it without compiling
        jax.eval_shape(lambda: init_variables(flax_model, 0, 32))
    assert seen == [(1e-3, False)] * (2 * arch.depth + 1)

    x = (1000 + np.random.default_rng(0).normal(size=(4, 16, arch.width))).astype(np.float32)
    norm = torch_vit.LayerNorm(arch.width, eps=arch.norm_eps)
    with torch.no_grad():
        expected = norm(torch.from_numpy(x)).numpy()

    class Norm(fnn.Module):
        @fnn.compact
        def __call__(self, x):
            return flax_vit.layer_norm(x, arch.norm_eps, "norm")

    ones = {"params": {"norm": {"scale": jnp.ones(arch.width), "bias": jnp.zeros(arch.width)}}}
    assert max_relative_difference(np.asarray(Norm().apply(ones, jnp.asarray(x))), expected) < 1e-3
    fast = fnn.LayerNorm(epsilon=arch.norm_eps).apply({"params": ones["params"]["norm"]}, jnp.asarray(x))
    assert max_relative_difference(np.asarray(fast), expected) > 1e-2  # the trap the setting avoids


# gradient checkpointing: vit-micro has 2 blocks
PLANS = {"attention": RematPlan(attention=True), "block 2": RematPlan(blocks=(1,)), "all": RematPlan(blocks=(0, 1)),
         "block 1 + attention": RematPlan(blocks=(0,), attention=True)}


def _batch(dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(4, 32, 32, 3)).astype(dtype), rng.integers(0, 10, size=4)


def test_torch_remat_keeps_loss_and_gradients_and_saves_less():
    images, labels = _batch()
    x, y = torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels)
    results = {}
    for name, plan in {"none": RematPlan(), **PLANS}.items():
        model = _torch_model(micro(), attention="naive", remat=plan).double().train()
        with count_saved_bytes() as saved:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        results[name] = (saved[0], loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()})
    saved0, loss0, grads0 = results["none"]
    for name in PLANS:
        saved, loss, grads = results[name]
        assert abs(loss / loss0 - 1) < 1e-12, name
        assert max(max_relative_difference(grads[k], grads0[k]) for k in grads0) < 1e-9, name
    bytes_ = {name: r[0] for name, r in results.items()}
    assert bytes_["all"] < bytes_["block 2"] < bytes_["none"], bytes_
    assert bytes_["all"] < bytes_["attention"] < bytes_["none"], bytes_
    assert bytes_["block 1 + attention"] < min(bytes_["attention"], bytes_["block 2"]), bytes_


def _flax_loss(arch: EncoderArch, plan: RematPlan, policy: str, images, labels, dtype=jnp.float32):
    model = flax_vit.make_model(arch, ModelOptions(dtype=jnp.dtype(dtype).name, attention="naive", remat=plan,
                                                     remat_policy=policy))

    def loss(params):
        logits = model.apply({"params": params}, images, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss


@pytest.mark.slow  # its own remat programs: 13.6 s of `make test-fast` here
def test_jax_remat_keeps_loss_and_gradients():
    arch = micro()
    images, labels = _batch()
    cases = {"none": (RematPlan(), "nothing_saveable"), "attention": (PLANS["attention"], "nothing_saveable"),
             "all": (PLANS["all"], "nothing_saveable"), "block 1 + attention": (PLANS["block 1 + attention"],
             "nothing_saveable"), "all, dots saveable": (PLANS["all"], "dots_with_no_batch_dims_saveable")}
    params = torch_weights_for_flax(_torch_model(arch), arch, np.float64)["params"]
    with jax.enable_x64(True):
        grad_fns = {name: jax.value_and_grad(_flax_loss(arch, plan, policy, images, labels, jnp.float64))
                    for name, (plan, policy) in cases.items()}
        # one jit for all cases: one compilation (each costs seconds on a small CPU), the cases stay independent
        results = jax.jit(lambda p: {name: fn(p) for name, fn in grad_fns.items()})(params)
    loss0, grads0 = results.pop("none")
    assert grads0["blocks_0"]["attn"]["qkv"]["kernel"].dtype == jnp.float64
    for name, (loss, grads) in results.items():
        assert abs(float(loss) / float(loss0) - 1) < 1e-12, name
        gaps = jax.tree.map(lambda a, b: max_relative_difference(np.asarray(a), np.asarray(b)), grads, grads0)
        assert max(jax.tree.leaves(gaps)) < 1e-9, name


def test_jax_remat_saves_less():
    """Residuals kept for the backward pass (jax_impl/train.py::measure_saved_bytes's measure). The named policy
    dots_with_no_batch_dims_saveable keeps the projections' outputs (dots without batch dimensions) but not the
    attention scores (batched over batch and heads): between no remat and nothing_saveable."""
    from jax._src.ad_checkpoint import saved_residuals

    arch = micro()
    images, labels = (jnp.asarray(a) for a in _batch(np.float32))
    params = flax_template(arch)["params"]  # residuals are shapes: no values needed

    def saved(plan: RematPlan, policy: str = "nothing_saveable") -> int:
        loss = _flax_loss(arch, plan, policy, images, labels)
        return int(sum(math.prod(aval.shape) * aval.dtype.itemsize for aval, _ in saved_residuals(loss, params)))

    none = saved(RematPlan())
    nothing = {name: saved(plan) for name, plan in PLANS.items()}
    assert nothing["all"] < nothing["block 2"] < none, nothing
    assert nothing["all"] < nothing["attention"] < none, nothing
    assert nothing["block 1 + attention"] < min(nothing["attention"], nothing["block 2"]), nothing
    for name in ("attention", "all"):
        dots = saved(PLANS[name], "dots_with_no_batch_dims_saveable")
        assert nothing[name] < dots < none, (name, nothing[name], dots, none)


def _large_scores_qkv() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (batch, heads, tokens, head_dim) rounded to fp16 (held in fp32), scaled so that scores q.k/sqrt(d)
    reach ~50: finite in fp16 (max 65504), but exp(score) overflows fp16 from score 11.1 = log(65504) on."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 2, 16, 32)) * s for s in (4, 4, 1))
    return tuple(a.astype(np.float16).astype(np.float32) for a in (q, k, v))


def _check_overflow_demo(scores16: np.ndarray, naive_softmax16: np.ndarray, mixed: np.ndarray,
                         reference: np.ndarray, tolerance: float) -> None:
    assert math.log(65504) < np.abs(scores16).max() < 1000 and np.isfinite(scores16).all()
    assert not np.isfinite(naive_softmax16).all()  # exp overflows to inf, inf / inf = NaN
    assert mixed.dtype == np.float16 and np.isfinite(mixed).all()
    assert max_relative_difference(mixed.astype(np.float32), reference) < tolerance


# The model's path computes the scores product in fp16 (as autocast would) and only then the softmax in fp32: the
# scores, up to ~50 here, are rounded to fp16's spacing of 2^-5 there, so an attention weight may be off by up to
# exp(2^-6) - 1 ~ 1.6%: 2e-2 relative to max |output| (measured 7e-3). The fused kernels keep the scores in fp32
# inside (measured 4e-4, the fp16 rounding of the output): 2e-3.
NAIVE_FP16_TOLERANCE, FUSED_FP16_TOLERANCE = 2e-2, 2e-3


def test_fp16_softmax_overflows_where_fp32_softmax_does_not_torch():
    """The article's warning. The overflowing formulation is exp-then-normalise in fp16 (what a hand-written
    kernel does without the max subtraction): logits above 11.1 already overflow. torch.softmax itself subtracts
    the row max first, so on fp16 scores it overflows only once the scores themselves are beyond 65504 (inf), by
    which point the fp16 scores product of any fp16 path is inf as well: it is shown finite here."""
    q, k, v = (torch.from_numpy(a) for a in _large_scores_qkv())
    q16, k16, v16 = q.half(), k.half(), v.half()
    scores16 = (q16 @ k16.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]))
    exp16 = torch.exp(scores16)
    naive16 = exp16 / exp16.sum(-1, keepdim=True)
    assert torch.isfinite(torch.softmax(scores16, dim=-1)).all()
    reference = torch_vit.naive_attention(q, k, v).numpy()
    _check_overflow_demo(scores16.float().numpy(), naive16.float().numpy(),
                         torch_vit.naive_attention(q16, k16, v16).numpy(), reference, NAIVE_FP16_TOLERANCE)
    fused = F.scaled_dot_product_attention(q16, k16, v16)
    assert fused.dtype == torch.float16
    assert max_relative_difference(fused.float().numpy(), reference) < FUSED_FP16_TOLERANCE


def test_fp16_softmax_overflows_where_fp32_softmax_does_not_jax():
    q, k, v = (jnp.asarray(a.transpose(0, 2, 1, 3)) for a in _large_scores_qkv())  # (batch, tokens, heads, dim)
    q16, k16, v16 = (a.astype(jnp.float16) for a in (q, k, v))
    scores16 = jnp.einsum("bqhd,bkhd->bhqk", q16, k16) * jnp.asarray(1 / math.sqrt(q.shape[-1]), jnp.float16)
    exp16 = jnp.exp(scores16)
    naive16 = exp16 / exp16.sum(-1, keepdims=True)
    reference = np.asarray(flax_vit.naive_attention(q, k, v))
    _check_overflow_demo(np.asarray(scores16, np.float32), np.asarray(naive16, np.float32),
                         np.asarray(flax_vit.naive_attention(q16, k16, v16)), reference, NAIVE_FP16_TOLERANCE)
    # jitted, as in training. On XLA:CPU the fused path in fp16 is the written-out one (jax_impl/transformer.py:
    # the XLA implementation's F16_F16_F32 dot fails to compile there), so the naive path's tolerance
    fused = np.asarray(jax.jit(flax_vit.fused_attention)(q16, k16, v16))
    assert fused.dtype == np.float16 and np.isfinite(fused).all()
    cpu_fallback = jax.devices()[0].platform == "cpu"
    tolerance = NAIVE_FP16_TOLERANCE if cpu_fallback else FUSED_FP16_TOLERANCE
    assert max_relative_difference(fused.astype(np.float32), reference) < tolerance


# bf16 keeps 8 significant bits: each rounding is up to 2^-9 ~ 2e-3 relative. vit-micro's logits pass through a
# dozen rounded products in sequence (patch embedding, per block qkv, scores, weights x v, proj, fc1, fc2, then the
# head) and are themselves bf16: ~1e-2 if the errors added up in the worst way; measured 4e-3 to 5e-3 on both sides.
BF16_TOLERANCE = 3e-2


def test_bf16_logits_are_close_to_fp32():
    arch = micro()
    model = _torch_model(arch).eval()
    images, _ = _batch(np.float32)
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    with torch.no_grad():
        reference = model(x).numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch_bf16 = model(x)
    assert torch_bf16.dtype == torch.bfloat16
    variables = torch_weights_for_flax(model, arch)
    flax_bf16 = jax.jit(flax_vit.make_model(arch, ModelOptions(dtype="bfloat16")).apply)(variables, jnp.asarray(images))
    assert flax_bf16.dtype == jnp.bfloat16
    for got in (torch_bf16.float().numpy(), np.asarray(flax_bf16, np.float32)):
        gap = max_relative_difference(got, reference)
        assert 1e-4 < gap < BF16_TOLERANCE, gap  # really computed in bf16, and close
