"""The twin models compute the same thing: same weights and input give the same logits, statistics and
gradients; weights transfer both ways exactly; our torch ResNet-50 is torchvision's."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torchvision

from common.arch import resnet
from common.model_options import ModelOptions
from common.weights import flax_to_torch, torch_to_flax
from experiments.execution.parity import (
    TOLERANCES,
    fp32_gaps_and_noise_floor,
    load_flax_into_torch,
    paired_forward_backward,
)
from jax_impl.models import init_variables
from jax_impl.models import make_model as make_flax
from torch_impl.models import make_model as make_torch

# torchvision's ResNet-18 as it is (the ImageNet stem, BatchNorm); the CIFAR stem and GroupNorm on the ResNet-10 (one
# basic block a stage, the same block code: XLA compiles its programs in ~30% less time than the ResNet-18's)
CONFIGS = [("resnet10", "cifar", "batch"), ("resnet18", "imagenet", "batch"), ("resnet10", "cifar", "group")]


@pytest.mark.slow
@pytest.mark.parametrize("name,stem,norm", CONFIGS)
def test_fp32_logits_statistics_and_gradients_match(name, stem, norm):
    """fp32 at the issue's tolerances, beyond which only this machine's own fp32 rounding may take them.

    With some batches a ReLU input lies within fp32 rounding of zero and switches sides in one framework only;
    that single position moves a conv-weight gradient by ~1e-2 relative (1.56e-2 seen on an AMD EPYC with seed 0,
    where an Intel Xeon gave 1e-5). So the test measures, in this very test, how far each framework's fp32 result
    lies from its own fp64 result on the same weights and batch; two correct fp32 computations can differ by at
    most the sum of those (triangle inequality). A real difference between the implementations would not appear
    in either framework's fp32-vs-fp64 distance, and the float64 test below proves the semantics equal at 1e-9."""
    arch = resnet(name, stem=stem, width=0.25, num_classes=100, norm=norm)
    size = 32 if stem == "cifar" else 64
    results, floor = fp32_gaps_and_noise_floor(arch, batch_size=8, image_size=size, seed=0)
    for quantity, value in results.items():
        allowed = TOLERANCES[quantity] + floor[quantity]
        assert value <= allowed, f"{quantity}: {value:.2e} > {TOLERANCES[quantity]:.0e} + floor {floor[quantity]:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name,stem,norm,seed", [(*c, s) for c in CONFIGS for s in (1, 2)] +
                         [("resnet50", "cifar", "batch", 1)])
def test_float64_semantics_are_identical(name, stem, norm, seed):
    """In fp64 rounding cannot flip a ReLU or be amplified through deep BatchNorm stacks (a random-init
    ResNet-50 in fp32 shows gradient gaps of 1e-1 while its logits agree), so any gap above 1e-9
    would be a real difference between the implementations. The ResNet-50 proves the bottleneck blocks (one stem:
    the basic-block models prove both; its ImageNet-stem case cost the suite ~17 s)."""
    arch = resnet(name, stem=stem, width=0.25, num_classes=100, norm=norm)
    size = 32 if stem == "cifar" else 64
    # batch 8 for the basic-block models: the fp32 test above runs the same fp64 programs (its noise floor), so the
    # two tests compile them once between them through the suite's shared JAX cache (at batch 4 each configuration
    # compiled a second fp64 gradient program, 7-9 s here)
    batch_size = 4 if name == "resnet50" else 8
    results = paired_forward_backward(arch, batch_size=batch_size, image_size=size, seed=seed, float64=True)
    assert max(results.values()) < 1e-9, results


@pytest.mark.slow
def test_transfer_round_trips_exactly_both_ways():
    arch = resnet("resnet50", stem="imagenet", width=0.25, num_classes=10)
    torch.manual_seed(3)
    model = make_torch(arch)
    with torch.no_grad():  # make running statistics non-trivial so they are checked too
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    # the template's shapes and dtypes are all the transfer reads (a compiled init of this ResNet-50: 14 s here)
    template = jax.eval_shape(lambda: init_variables(make_flax(arch), 0, 64))
    variables = torch_to_flax(model.state_dict(), template)
    back = flax_to_torch(variables)
    state = model.state_dict()
    assert set(back) == {k for k in state if not k.endswith("num_batches_tracked")}
    for key, value in back.items():
        np.testing.assert_array_equal(value, state[key].numpy())
    other = make_torch(arch)
    load_flax_into_torch(other, variables)
    again = torch_to_flax(other.state_dict(), template)
    jax.tree.map(np.testing.assert_array_equal, again, variables)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_weights_file_of_another_model_is_refused_and_named(tmp_path, framework):
    """A ResNet-10's weights offered to a ResNet-18: both trainers refuse the file and name the blocks it lacks (4 x 10
    tensors; torch once kept its own random init for them and ran at chance accuracy; JAX's transfer raised)."""
    from common.config import RunConfig
    from common.errors import ConfigError
    from common.workloads import arch as describe
    from jax_impl.train import make_model as jax_model
    from torch_impl.train import export_initial_weights
    from torch_impl.train import make_model as torch_model

    path = tmp_path / "resnet10.npz"
    export_initial_weights(RunConfig(model="resnet10", width=0.125), 10, str(path))
    config = RunConfig(model="resnet18", width=0.125, init_weights=str(path))
    make = {"torch": torch_model, "jax": jax_model}[framework]
    with pytest.raises(ConfigError, match=r"resnet10\.npz does not hold this model's weights: 40 missing \(layer1\.1"):
        make(config, describe(config, 10))
    reverse = tmp_path / "resnet18.npz"  # and the other way: tensors the model does not have
    export_initial_weights(config.replace(init_weights=None), 10, str(reverse))
    small = RunConfig(model="resnet10", width=0.125, init_weights=str(reverse))
    with pytest.raises(ConfigError, match=r"0 missing \(-\), 40 not in the model \(layer1\.1\."):
        make(small, describe(small, 10))


def test_resnet50_is_torchvisions_resnet50():
    arch = resnet("resnet50", stem="imagenet", width=1.0, num_classes=100)
    ours = make_torch(arch).eval()
    theirs = torchvision.models.resnet50(num_classes=100).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    ours.load_state_dict(theirs.state_dict())  # strict: every name and shape agrees
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_resnet10_is_torchvisions_resnet_with_one_block_a_stage():
    """ResNet-10 (the tiny preset's and the suite's model) is torchvision's ResNet class with layers [1, 1, 1, 1]:
    its state_dict loads by name and computes the same function."""
    from torchvision.models.resnet import BasicBlock, ResNet

    ours = make_torch(resnet("resnet10", stem="imagenet", width=1.0, num_classes=100)).eval()
    theirs = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=100).eval()
    ours.load_state_dict(theirs.state_dict())  # strict: every name and shape agrees
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_flax_parameter_count_equals_torch():
    arch = resnet("resnet50", stem="imagenet", width=1.0, num_classes=100)
    variables = jax.eval_shape(lambda: init_variables(make_flax(arch), 0, 64))
    flax_count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(variables["params"]))
    assert flax_count == sum(p.numel() for p in torchvision.models.resnet50(num_classes=100).parameters())


def test_initialisation_distributions_match():
    """Both sides draw from the same distributions (not the same numbers): conv std sqrt(2/fan_out),
    untruncated; Linear uniform +-1/sqrt(fan_in)."""
    arch = resnet("resnet18", width=1.0, num_classes=100)
    torch.manual_seed(0)
    torch_state = make_torch(arch).state_dict()
    flax_state = flax_to_torch(init_variables(make_flax(arch), 0))
    for key in ("layer3.0.conv2.weight", "fc.weight", "fc.bias"):
        t, f = torch_state[key].numpy(), flax_state[key]
        assert f.shape == t.shape
        assert abs(f.std() / t.std() - 1) < 0.05, key
        assert abs(np.abs(f).max() / np.abs(t).max() - 1) < 0.2, key
    fan_out = 256 * 9
    assert abs(flax_state["layer3.0.conv2.weight"].std() - (2 / fan_out) ** 0.5) < 0.02 * (2 / fan_out) ** 0.5


def test_zero_init_residual_zeroes_last_norm_scale_on_both_sides():
    arch = resnet("resnet18", width=0.25, zero_init_residual=True)
    t = make_torch(arch).state_dict()
    f = flax_to_torch(init_variables(make_flax(arch), 0))
    for key in ("layer1.0.bn2.weight", "layer4.1.bn2.weight"):
        assert not t[key].any() and not f[key].any()
    assert t["layer1.0.bn1.weight"].all() and f["layer1.0.bn1.weight"].all()


def test_channels_last_gives_the_same_logits():
    arch = resnet("resnet18", width=0.25)
    torch.manual_seed(0)
    plain = make_torch(arch).eval()
    torch.manual_seed(0)
    channels_last = make_torch(arch, ModelOptions(channels_last=True)).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        got = channels_last(x.to(memory_format=torch.channels_last))
        torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)
    assert channels_last.conv1.weight.is_contiguous(memory_format=torch.channels_last)
