"""The text encoder twins (torch_impl/transformer.py, jax_impl/transformer.py on token inputs) compute the same
thing, and their padding mask is exact: how much padding follows a sequence changes neither its logits nor anything's
gradient, padded positions receive no gradient at all, and both attention kernels and gradient checkpointing agree
with the mask on."""

from __future__ import annotations

from functools import cache

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from test_transformer import KERNELS, PLANS, POOLS

from common.arch_encoder import CLS_ID, PAD_ID, TEXT_FAMILY, VOCAB_SIZE, EncoderArch, RematPlan, text
from common.errors import ConfigError
from common.model_options import ModelOptions
from common.weights import flax_to_torch, torch_to_flax
from experiments.execution.parity import (
    TOLERANCES,
    Quantities,
    _flax_quantities,
    compare,
    load_flax_into_torch,
    max_relative_difference,
)
from jax_impl import transformer as flax_text
from jax_impl.models import init_variables
from torch_impl import transformer as torch_text

LENGTHS = (6, 20, 1, 13)  # real tokens per row, the class token included; 1: the class token alone
EXTRA = 17  # more padding, the same sequences
CLASSES = 4


def micro(pool: str = "cls") -> EncoderArch:
    return text("text-micro", num_classes=CLASSES, max_len=48, pool=pool)


def _batch(extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of LENGTHS real tokens (class token, then bytes), right-padded to the longest plus ``extra``: the same
    sequences whatever ``extra``."""
    rng = np.random.default_rng(0)
    tokens = np.full((len(LENGTHS), max(LENGTHS) + extra), PAD_ID, np.int64)
    for row, length in enumerate(LENGTHS):
        tokens[row, 0] = CLS_ID
        tokens[row, 1:length] = rng.integers(2, VOCAB_SIZE, size=length - 1)
    return tokens, rng.integers(0, CLASSES, size=len(LENGTHS))


def _torch_model(arch: EncoderArch, seed: int = 0, **kwargs) -> torch_text.Encoder:
    torch.manual_seed(seed)
    return torch_text.make_model(arch, ModelOptions(**kwargs))


@cache
def flax_template(arch: EncoderArch) -> dict:
    """Shapes and dtypes of Flax's variables (no compiled init: the values come from torch)."""
    return jax.eval_shape(lambda: init_variables(flax_text.make_model(arch), 0))


def torch_weights_for_flax(model: torch.nn.Module, arch: EncoderArch, dtype=np.float32) -> dict:
    template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, dtype), flax_template(arch))
    return torch_to_flax(model.state_dict(), template)


def _torch_quantities(model: torch_text.Encoder, tokens: np.ndarray, labels: np.ndarray) -> Quantities:
    x = torch.from_numpy(tokens)
    model.eval()
    with torch.no_grad():
        logits_eval = model(x).numpy()
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, torch.from_numpy(labels))
    loss.backward()
    return Quantities(logits_eval, logits.detach().numpy(), loss.detach().numpy(), {},
                      {name: p.grad.numpy() for name, p in model.named_parameters()})


@cache
def paired(pool: str, kernel: str, float64: bool) -> tuple[Quantities, Quantities]:
    """(torch, Flax) logits, loss and gradients on the same torch-initialised weights and padded batch."""
    arch = micro(pool)
    tokens, labels = _batch(EXTRA)
    dtype = np.float64 if float64 else np.float32
    torch.set_float32_matmul_precision("highest")
    torch_side = _torch_quantities(_torch_model(arch, attention=kernel).to(torch.from_numpy(np.zeros(0, dtype)).dtype),
                                   tokens, labels)
    with jax.enable_x64(float64), jax.default_matmul_precision("highest"):
        model = flax_text.make_model(arch, ModelOptions(dtype=jnp.dtype(dtype).name, attention=kernel))
        variables = torch_weights_for_flax(_torch_model(arch), arch, dtype)
        flax_side = _flax_quantities(model, variables, tokens.astype(np.int32), labels)
    return torch_side, flax_side


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("pool", POOLS)
def test_torch_and_jax_agree_on_a_padded_batch(pool, kernel):
    torch_side, flax_side = paired(pool, kernel, False)
    results = compare(flax_side, torch_side)
    for quantity, value in results.items():
        assert value <= TOLERANCES[quantity], f"{quantity}: {value:.2e} > {TOLERANCES[quantity]:.0e}"
    torch64, flax64 = paired(pool, kernel, True)
    results = compare(flax64, torch64)
    assert max(results.values()) < 1e-9, results
    assert flax64.gradients["token_embed.weight"].dtype == np.float64


@pytest.mark.parametrize("pool", POOLS)
def test_naive_and_fused_attention_agree_with_a_mask_in_each_framework(pool):
    for side in (0, 1):  # torch, Flax
        naive, fused = paired(pool, "naive", False)[side], paired(pool, "fused", False)[side]
        results = compare(fused, naive)
        assert max(results.values()) <= 1e-5, (side, results)


# More padding adds keys of exactly zero attention weight and zero terms to the masked mean: only the order of
# summation may change, so fp64 agrees to rounding and fp32 to a few ulps
PADDING_TOLERANCE = {np.float64: 1e-12, np.float32: 1e-6}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pool", POOLS)
def test_more_padding_leaves_logits_unchanged(pool, dtype):
    arch = micro(pool)
    batches = {extra: _batch(extra)[0] for extra in (0, EXTRA)}
    torch_dtype = torch.from_numpy(np.zeros(0, dtype)).dtype
    for kernel in KERNELS:
        model = _torch_model(arch, attention=kernel).to(torch_dtype).eval()
        with torch.no_grad():
            short, long = (model(torch.from_numpy(batches[e])).numpy() for e in (0, EXTRA))
        assert max_relative_difference(long, short) <= PADDING_TOLERANCE[dtype], ("torch", kernel)
    with jax.enable_x64(dtype == np.float64):
        variables = torch_weights_for_flax(_torch_model(arch), arch, dtype)
        models = {kernel: flax_text.make_model(arch, ModelOptions(dtype=jnp.dtype(dtype).name, attention=kernel))
                  for kernel in KERNELS}
        # one jit for every case: one compilation
        logits = jax.jit(lambda v: {(k, e): models[k].apply(v, jnp.asarray(b, jnp.int32))
                                    for k in KERNELS for e, b in batches.items()})(variables)
    assert logits["naive", 0].dtype == dtype
    for kernel in KERNELS:
        gap = max_relative_difference(np.asarray(logits[kernel, EXTRA]), np.asarray(logits[kernel, 0]))
        assert gap <= PADDING_TOLERANCE[dtype], ("jax", kernel, gap)


def _check_no_gradient_at_padding(embedded_grad: np.ndarray, table_grad: np.ndarray, pos_grad: np.ndarray,
                                  tokens: np.ndarray) -> None:
    """Gradients of the loss w.r.t. the embedded tokens (batch, tokens, width), the token embedding table and the
    position embeddings: exactly 0 wherever only padding reaches, non-zero at every real token."""
    real = tokens != PAD_ID
    assert (embedded_grad[~real] == 0).all()
    assert (np.abs(embedded_grad[real]).sum(-1) > 0).all()
    assert (table_grad[PAD_ID] == 0).all() and np.abs(table_grad[CLS_ID]).sum() > 0
    assert (pos_grad[0, max(LENGTHS):] == 0).all() and (np.abs(pos_grad[0, :max(LENGTHS)]).sum(-1) > 0).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("pool", POOLS)
def test_padding_receives_no_gradient_torch(pool, kernel):
    tokens, labels = _batch(EXTRA)
    model = _torch_model(micro(pool), attention=kernel).train()
    captured = []

    def capture(module, args, out) -> None:  # returns None: the output stays as it is
        out.register_hook(captured.append)

    # the gradient w.r.t. the token embedding's output is the one w.r.t. token + position embedding (a sum)
    model.token_embed.register_forward_hook(capture)
    F.cross_entropy(model(torch.from_numpy(tokens)), torch.from_numpy(labels)).backward()
    _check_no_gradient_at_padding(captured[0].numpy(), model.token_embed.weight.grad.numpy(),
                                  model.pos_embed.grad.numpy(), tokens)


@pytest.mark.parametrize("pool", POOLS)
def test_padding_receives_no_gradient_jax(pool):
    arch = micro(pool)
    tokens, labels = _batch(EXTRA)
    params = torch_weights_for_flax(_torch_model(arch), arch)["params"]

    def loss(kernel: str, params, delta):
        def add_delta(next_fun, args, kwargs, context):  # token embedding + delta: d loss / d delta is the gradient
            out = next_fun(*args, **kwargs)
            is_embed = context.module.name == "token_embed" and context.method_name == "__call__"
            return out + delta if is_embed else out

        with fnn.intercept_methods(add_delta):
            model = flax_text.make_model(arch, ModelOptions(attention=kernel))
            logits = model.apply({"params": params}, tokens, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    delta = jnp.zeros((*tokens.shape, arch.width))
    grads = jax.jit(lambda p, d: {k: jax.grad(loss, argnums=(1, 2))(k, p, d) for k in KERNELS})(params, delta)
    for param_grads, delta_grad in grads.values():
        _check_no_gradient_at_padding(np.asarray(delta_grad), np.asarray(param_grads["token_embed"]["embedding"]),
                                      np.asarray(param_grads["pos_embed"]), tokens)


@pytest.mark.parametrize("pool", POOLS)
def test_transfer_round_trips_exactly_both_ways(pool):
    arch = micro(pool)
    model = _torch_model(arch)
    state = model.state_dict()
    variables = torch_weights_for_flax(model, arch)  # torch -> Flax -> torch
    assert variables["params"]["token_embed"]["embedding"].shape == (VOCAB_SIZE, arch.width)  # not transposed
    np.testing.assert_array_equal(variables["params"]["token_embed"]["embedding"], state["token_embed.weight"])
    back = flax_to_torch(variables)
    assert set(back) == set(state)
    for key, value in back.items():
        np.testing.assert_array_equal(value, state[key].numpy(), err_msg=key)
    rng = np.random.default_rng(0)  # Flax -> torch -> Flax, from values torch never drew
    flax_side = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), flax_template(arch))
    other = _torch_model(arch, seed=1)
    load_flax_into_torch(other, flax_side)
    again = torch_to_flax(other.state_dict(), flax_side)
    jax.tree.map(np.testing.assert_array_equal, again, flax_side)
    assert not np.array_equal(again["params"]["token_embed"]["embedding"],
                              variables["params"]["token_embed"]["embedding"])


def test_torch_remat_keeps_fp64_gradients_with_a_mask():
    tokens, labels = _batch(EXTRA)
    x, y = torch.from_numpy(tokens), torch.from_numpy(labels)
    for kernel in KERNELS:
        results = {}
        for name, plan in {"none": RematPlan(), **PLANS}.items():
            model = _torch_model(micro("mean"), attention=kernel, remat=plan).double().train()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            results[name] = (loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()})
        loss0, grads0 = results.pop("none")
        for name, (loss, grads) in results.items():
            assert abs(loss / loss0 - 1) < 1e-12, (kernel, name)
            assert max(max_relative_difference(grads[k], grads0[k]) for k in grads0) < 1e-9, (kernel, name)


@pytest.mark.slow  # its own fp64 remat programs: 12.8 s of `make test-fast` here
def test_jax_remat_keeps_fp64_gradients_with_a_mask():
    """fused: in fp64 jax_impl's fused attention is the written-out one (see jax_impl/transformer.py), masked."""
    arch = micro("mean")
    tokens, labels = _batch(EXTRA)
    params = torch_weights_for_flax(_torch_model(arch), arch, np.float64)["params"]

    def loss_fn(plan: RematPlan):
        model = flax_text.make_model(arch, ModelOptions(dtype="float64", remat=plan))
        return lambda p: optax.softmax_cross_entropy_with_integer_labels(
            model.apply({"params": p}, tokens, train=True), labels).mean()

    with jax.enable_x64(True):
        fns = {name: jax.value_and_grad(loss_fn(plan)) for name, plan in {"none": RematPlan(), **PLANS}.items()}
        results = jax.jit(lambda p: {name: fn(p) for name, fn in fns.items()})(params)
    loss0, grads0 = results.pop("none")
    assert grads0["token_embed"]["embedding"].dtype == jnp.float64
    for name, (loss, grads) in results.items():
        assert abs(float(loss) / float(loss0) - 1) < 1e-12, name
        gaps = jax.tree.map(lambda a, b: max_relative_difference(np.asarray(a), np.asarray(b)), grads, grads0)
        assert max(jax.tree.leaves(gaps)) < 1e-9, name


def test_bad_input_and_names_raise_clear_errors():
    arch = micro()
    too_long = np.full((2, arch.max_len + 1), CLS_ID)
    model = _torch_model(arch)
    flax_model = flax_text.make_model(arch)
    for tokens in (too_long, too_long[0]):  # longer than max_len; not (batch, length)
        with pytest.raises(ConfigError, match="max_len|shape"):
            model(torch.from_numpy(tokens))
        with pytest.raises(ConfigError, match="max_len|shape"):
            jax.eval_shape(flax_model.apply, flax_template(arch), jnp.asarray(tokens, jnp.int32))
    with pytest.raises(ConfigError, match="max_len=48"):
        model(torch.from_numpy(too_long))
    with pytest.raises(ConfigError, match="unknown model"):
        text("text-huge")
    with pytest.raises(ConfigError, match="pool"):
        text("text-micro", pool="max")
    assert text("text-base").width == 768 and set(TEXT_FAMILY) == {"text-micro", "text-tiny", "text-base"}
