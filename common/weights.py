"""Weight transfer between a torch state_dict and Flax variables, in numpy only (no framework imports),
so either trainer can load the other's initial weights.

Mapping (from the shared description's names): torch ``layer2.0.downsample.0.weight`` (OIHW) <->
Flax ``params/layer2_0/downsample_conv/kernel`` (HWIO); BatchNorm ``weight/bias`` <-> ``scale/bias`` and
``running_mean/running_var`` <-> ``batch_stats/.../mean|var``; Linear ``weight`` (out, in) <-> Dense
``kernel`` (in, out). The transformer's names are timm's: Flax ``blocks_3/attn/qkv/kernel`` <-> torch
``blocks.3.attn.qkv.weight``; LayerNorm ``scale`` <-> ``weight``; ``cls_token`` and ``pos_embed`` keep their names
and shapes. The text encoder's Flax ``token_embed/embedding`` <-> torch ``token_embed.weight``, both (vocab, width):
not transposed, unlike a Dense kernel of the same rank. ``num_batches_tracked`` has no Flax counterpart (torch uses
it only when momentum is None) and is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import ConfigError

FLAX_TO_TORCH_MODULE = {"downsample_conv": "downsample.0", "downsample_bn": "downsample.1"}
# only a leaf named "kernel" is ever transposed (_to_flax, _to_torch): an "embedding" keeps its (vocab, width)
PARAM_NAMES = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}
STAT_NAMES = {"mean": "running_mean", "var": "running_var"}
NUMBERED = re.compile(r"^(layer\d+|blocks)_(\d+)$")  # Flax's "layer2_0" / "blocks_3" -> torch's "layer2.0" / "blocks.3"


def torch_key(path: tuple[str, ...], leaf: str, collection: str) -> str:
    """Flax (module path, leaf name, collection) -> torch state_dict key."""
    parts = []
    for module in path:
        if match := NUMBERED.match(module):
            parts.append(f"{match[1]}.{match[2]}")
        elif module == "gn":  # Flax GroupNorm wrapper's inner module: torch has one module there
            continue
        else:
            parts.append(FLAX_TO_TORCH_MODULE.get(module, module))
    names = STAT_NAMES if collection == "batch_stats" else PARAM_NAMES
    return ".".join(parts + [names.get(leaf, leaf)])  # cls_token, pos_embed: the same name on both sides


def _to_flax(leaf: str, value: np.ndarray) -> np.ndarray:
    if leaf == "kernel" and value.ndim == 4:
        return value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    if leaf == "kernel" and value.ndim == 2:
        return value.T  # (out, in) -> (in, out)
    return value


def _to_torch(leaf: str, value: np.ndarray) -> np.ndarray:
    if leaf == "kernel" and value.ndim == 4:
        return value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    if leaf == "kernel" and value.ndim == 2:
        return value.T
    return value


def _walk(tree: Mapping[str, Any], path: tuple[str, ...] = ()):
    for name, value in tree.items():
        if isinstance(value, Mapping):
            yield from _walk(value, path + (name,))
        else:
            yield path, name, value


def _rebuild(tree: Mapping[str, Any], leaf_fn, path: tuple[str, ...] = ()) -> dict[str, Any]:
    return {name: _rebuild(value, leaf_fn, path + (name,)) if isinstance(value, Mapping) else leaf_fn(path, name, value)
            for name, value in tree.items()}


def torch_keys(flax_template: Mapping[str, Any]) -> list[str]:
    """The torch state_dict keys of a Flax variable tree (its leaves' names, as ``torch_to_flax`` reads them)."""
    return [torch_key(path, leaf, collection) for collection, tree in flax_template.items()
            for path, leaf, _ in _walk(tree)]


def torch_to_flax(state_dict: Mapping[str, Any], flax_template: Mapping[str, Any],
                  source: str = "the torch state_dict") -> dict[str, Any]:
    """New Flax variables shaped like ``flax_template`` with the values of a torch ``state_dict``, which must name
    exactly the template's tensors (``check_torch_keys``: the same refusal as torch's own load)."""
    check_torch_keys(state_dict, torch_keys(flax_template), source)

    def collection_fn(collection: str):
        def leaf_fn(path: tuple[str, ...], leaf: str, template: Any) -> np.ndarray:
            key = torch_key(path, leaf, collection)
            raw = state_dict[key]
            value = _to_flax(leaf, np.asarray(raw.detach().cpu().numpy() if hasattr(raw, "detach") else raw))
            if value.shape != tuple(template.shape):
                raise ValueError(f"shape mismatch for {key}: torch gives {value.shape}, Flax expects "
                                 f"{tuple(template.shape)}")
            return value.astype(template.dtype)
        return leaf_fn

    return {collection: _rebuild(tree, collection_fn(collection)) for collection, tree in flax_template.items()}


def flax_to_torch(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A torch-keyed dict of numpy arrays from Flax variables (load with ``load_flax_into_torch``)."""
    state: dict[str, np.ndarray] = {}
    for collection, tree in variables.items():
        for path, leaf, value in _walk(tree):
            state[torch_key(path, leaf, collection)] = _to_torch(leaf, np.asarray(value))
    return state


def flax_grads_to_torch(grads: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return flax_to_torch({"params": grads})


def check_torch_keys(loaded: Iterable[str], expected: Iterable[str], source: str) -> None:
    """Refuse a torch-keyed weights file that does not name exactly the model's tensors (BatchNorm's step counters
    apart: Flax keeps none). Without this, torch loaded a ResNet-10's file into a ResNet-18 and kept its own random
    init for the blocks the file lacked: a model at chance accuracy and no error, where JAX's transfer raised."""
    def counted(keys: Iterable[str]) -> set[str]:
        return {k for k in keys if not k.endswith("num_batches_tracked")}

    loaded, expected = counted(loaded), counted(expected)
    missing, unexpected = sorted(expected - loaded), sorted(loaded - expected)
    if missing or unexpected:
        raise ConfigError(f"{source} does not hold this model's weights: {len(missing)} missing "
                          f"({', '.join(missing[:3]) or '-'}), {len(unexpected)} not in the model "
                          f"({', '.join(unexpected[:3]) or '-'}); was it saved from another --model?")


def save_torch_keyed(path: str | Path, state: Mapping[str, np.ndarray]) -> None:
    """Initial weights as a torch-keyed .npz, the hand-over format between the two trainers."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in state.items()})
    tmp.replace(path)


def load_torch_keyed(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}
