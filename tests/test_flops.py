"""Analytic FLOPs from the shared description agree with torch's counter and XLA's cost analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from common.arch import resnet
from common.flops import forward_flops
from jax_impl.models import init_variables
from jax_impl.models import make_model as make_flax
from torch_impl.models import make_model as make_torch

CASES = [("resnet18", "cifar", 32), ("resnet50", "imagenet", 64)]


@pytest.mark.parametrize("name,stem,size", CASES)
def test_flops_match_torch_flop_counter(name, stem, size):
    arch = resnet(name, stem=stem, width=1.0)
    model = make_torch(arch).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(2, 3, size, size))
    assert abs(counter.get_total_flops() / forward_flops(arch, size, batch_size=2) - 1) < 0.02


@pytest.mark.parametrize("name,stem,size", CASES)
def test_flops_match_xla_cost_analysis(name, stem, size):
    """XLA skips products with the zero padding and adds normalisation/activation work; the count of
    in-image taps is the matching convention."""
    arch = resnet(name, stem=stem, width=1.0)
    model = make_flax(arch)
    variables = init_variables(model, jax.random.key(0), size)
    images = jnp.zeros((2, size, size, 3))
    compiled = jax.jit(lambda v, x: model.apply(v, x, train=False)).lower(variables, images).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    ours = forward_flops(arch, size, batch_size=2, count_padding=False)
    assert abs(analysis["flops"] / ours - 1) < 0.02


def test_padding_convention_only_changes_padded_convolutions():
    arch = resnet("resnet50", stem="cifar", width=0.5)
    with_padding = forward_flops(arch, 32)
    without = forward_flops(arch, 32, count_padding=False)
    assert 0.9 * with_padding < without < with_padding
    assert forward_flops(arch, 32, batch_size=4) == 4 * with_padding
