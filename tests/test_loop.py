"""The one training loop and its two backends: the twin contract, and what the loop evaluates on."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.data.augment import channel_stats, normalise
from common.loop import Backend
from common.workloads import open_sources


def _backend(framework: str):
    if framework == "torch":
        from torch_impl.backend import Backend as Twin
    else:
        from jax_impl.backend import Backend as Twin
    return Twin


def _contract() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Backend).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_backends_implement_the_protocol_name_for_name(framework):
    """Every Protocol method, with the same parameter names; nothing public beyond it, so the two read alike."""
    twin = _backend(framework)
    public = {name for name in dir(twin) if not name.startswith("_") and callable(getattr(twin, name))}
    assert public == set(_contract())
    for name, signature in _contract().items():
        assert list(inspect.signature(getattr(twin, name)).parameters) == list(signature.parameters), name
    assert {"name", "version", "device"} <= set(dir(twin)) and twin.name == framework


def test_the_two_backends_have_the_same_shape():
    torch_twin, jax_twin = _backend("torch"), _backend("jax")
    for name in _contract():
        assert inspect.signature(getattr(torch_twin, name)) == inspect.signature(getattr(jax_twin, name)), name


def _as_nhwc(framework: str, images) -> np.ndarray:
    array = np.asarray(images.numpy() if framework == "torch" else images)
    return array.transpose(0, 2, 3, 1) if framework == "torch" else array


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("workers", [0, 2])
def test_evaluation_reads_normalised_unaugmented_test_images_in_file_order(cifar100_archive: Path, framework, workers):
    """The loader the loop evaluates on gives the test split exactly: no crop, no flip, no shuffle, whatever
    the training loader's worker count (a defect once: eval ran on augmented, shuffled test images)."""
    config = RunConfig(data=str(cifar100_archive), batch_size=64, steps=1, epochs=None, workers=workers,
                       prefetch=2, persistent_workers=workers > 0)
    backend = _backend(framework)()
    backend.start(config)
    try:
        train_source, test_source = open_sources(config)
        _, eval_loader = backend.loaders(train_source, test_source)
        batches = list(eval_loader.epoch(0))
    finally:
        backend.finish(clean=True)
    mean, std = channel_stats("cifar100")
    images = np.concatenate([_as_nhwc(framework, x) for x, _ in batches])
    labels = np.concatenate([np.asarray(y) for _, y in batches])
    expected = np.stack([normalise(test_source[i][0], mean, std) for i in range(len(test_source))])
    np.testing.assert_array_equal(labels, [test_source[i][1] for i in range(len(test_source))])
    np.testing.assert_array_equal(images, expected)


def test_reported_accuracy_is_the_accuracy_on_the_test_split(cifar100_archive: Path, tmp_path):
    """End to end (torch): the accuracy fit reports equals one computed here from its final weights on the
    plain test images."""
    import torch

    from common.workloads import arch
    from torch_impl.backend import fit
    from torch_impl.train import make_model

    weights = tmp_path / "final.npz"
    config = RunConfig(data=str(cifar100_archive), width=0.125, batch_size=32, steps=6, epochs=None, lr=0.05,
                       timing_warmup=1, save_weights=str(weights))
    result = fit(config)
    assert result.ok and result.eval is not None and result.eval.samples == 200
    model = make_model(config.replace(init_weights=str(weights)), arch(config, 100), torch.device("cpu")).eval()
    _, test_source = open_sources(config)
    mean, std = channel_stats("cifar100")
    images = torch.from_numpy(np.stack([normalise(test_source[i][0], mean, std) for i in range(len(test_source))]))
    labels = np.asarray([test_source[i][1] for i in range(len(test_source))])
    with torch.no_grad():  # in the run's own batches, so even a near-tie rounds the same way on any CPU
        batches = torch.split(images.permute(0, 3, 1, 2).contiguous(), config.batch_size)
        predicted = torch.cat([model(batch).argmax(1) for batch in batches]).numpy()
    assert result.eval.accuracy == pytest.approx(float((predicted == labels).mean()), abs=1e-12)
