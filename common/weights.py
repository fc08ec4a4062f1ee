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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

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


def torch_to_flax(state_dict: Mapping[str, Any], flax_template: Mapping[str, Any]) -> dict[str, Any]:
    """New Flax variables shaped like ``flax_template`` with the values of a torch ``state_dict``."""
    used: set[str] = set()

    def collection_fn(collection: str):
        def leaf_fn(path: tuple[str, ...], leaf: str, template: Any) -> np.ndarray:
            key = torch_key(path, leaf, collection)
            if key not in state_dict:
                raise KeyError(f"torch state_dict has no '{key}' for Flax {collection}/{'/'.join(path)}/{leaf}")
            used.add(key)
            raw = state_dict[key]
            value = _to_flax(leaf, np.asarray(raw.detach().cpu().numpy() if hasattr(raw, "detach") else raw))
            if value.shape != tuple(template.shape):
                raise ValueError(f"shape mismatch for {key}: torch gives {value.shape}, Flax expects "
                                 f"{tuple(template.shape)}")
            return value.astype(template.dtype)
        return leaf_fn

    out = {collection: _rebuild(tree, collection_fn(collection)) for collection, tree in flax_template.items()}
    leftover = sorted(k for k in state_dict if k not in used and not k.endswith("num_batches_tracked"))
    if leftover:
        raise KeyError(f"torch weights with no Flax counterpart: {', '.join(leftover[:5])}")
    return out


def flax_to_torch(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A torch-keyed dict of numpy arrays from Flax variables (load with ``load_flax_into_torch``)."""
    state: dict[str, np.ndarray] = {}
    for collection, tree in variables.items():
        for path, leaf, value in _walk(tree):
            state[torch_key(path, leaf, collection)] = _to_torch(leaf, np.asarray(value))
    return state


def flax_grads_to_torch(grads: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return flax_to_torch({"params": grads})


def save_torch_keyed(path: str | Path, state: Mapping[str, np.ndarray]) -> None:
    """Initial weights as a torch-keyed .npz, the hand-over format between the two trainers."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in state.items()})
    tmp.replace(path)


def load_torch_keyed(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}
