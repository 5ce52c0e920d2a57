"""ParaFormer compression and expansion: a model's first k branches, or the model with more branches.

Pure functions on a model-config dict (`ModelConfig.to_dict()` or `VisionConfig.to_dict()`: both have
num_layers and num_branches) and a global state dict (experts by global index, as a folder holds them).

Branch b owns blocks b*L .. b*L+L-1 of every per-block module list of the encoder (`attention`, `ffn`,
`attention_norm`, `ffn_norm`; keys `encoder.<list>.<i>.` for vision, `widenet.encoder.<list>.<i>.` for text).
A shared list holds only index 0 and belongs to every branch. So the first k branches are the first k*L
blocks of every per-block list plus everything else, and a model compressed to k branches computes exactly
what the full model computes with `forward(branches=k)`. Expanding appends blocks: the old branches and every
shared part keep their weights, the new branches take theirs from a freshly initialised model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from widenet_ds.errors import CheckpointError, ConfigError

PER_BLOCK_LISTS = ("attention", "ffn", "attention_norm", "ffn_norm")
_BLOCK_KEY = re.compile(r"^(?:widenet\.)?encoder\.(" + "|".join(PER_BLOCK_LISTS) + r")\.(\d+)\.")


@dataclass(frozen=True)
class BranchLayout:
    num_branches: int
    layers_per_branch: int

    @property
    def num_layers(self) -> int:
        return self.num_branches * self.layers_per_branch


def layout_of(config: dict[str, Any]) -> BranchLayout:
    """The branch layout a config describes; an error when it has no branches."""
    num_layers, num_branches = config.get("num_layers"), config.get("num_branches", 1)
    if not isinstance(num_layers, int) or not isinstance(num_branches, int) or num_layers <= 0 or num_branches <= 0:
        raise ConfigError(f"the model config has num_layers = {num_layers!r}, num_branches = {num_branches!r}; "
                          f"expected positive integers (is it a widenet-ds model config?).")
    if num_branches == 1:
        raise ConfigError("the model has no branches (num_branches = 1): compression and expansion keep or add "
                          "ParaFormer branches; train a model with num_branches > 1 (e.g. paraformer-tiny-3x4).")
    if num_layers % num_branches:
        raise ConfigError(f"num_branches = {num_branches} does not divide num_layers = {num_layers}; the config is "
                          f"not a branch layout.")
    return BranchLayout(num_branches, num_layers // num_branches)


def block_index(key: str) -> tuple[str, int] | None:
    """(list name, block index) of a key inside a per-block list of the encoder, else None."""
    match = _BLOCK_KEY.match(key)
    return (match.group(1), int(match.group(2))) if match else None


def per_block_lists(state: dict[str, Tensor], layout: BranchLayout) -> set[str]:
    """The lists that hold one module per block (the others are shared: index 0 only); an error when the
    state's blocks do not fit the layout."""
    indices: dict[str, set[int]] = {}
    for key in state:
        found = block_index(key)
        if found:
            indices.setdefault(found[0], set()).add(found[1])
    if "attention_norm" not in indices:
        raise CheckpointError("the weights hold no encoder.attention_norm.<i> entries; they are not a widenet-ds "
                              "encoder's (or the folder is damaged).")
    per_block = set()
    for name, seen in sorted(indices.items()):
        if seen == {0}:
            continue
        if seen != set(range(layout.num_layers)):
            raise CheckpointError(f"the weights' encoder.{name} has blocks {_ranges(seen)}, the config says "
                                  f"{layout.num_branches} branches x {layout.layers_per_branch} layers = "
                                  f"{layout.num_layers} blocks; the weights do not belong to this config.")
        per_block.add(name)
    if "attention_norm" not in per_block:
        raise CheckpointError("the weights share one LayerNorm pair across blocks (share_layernorm), which a branch "
                              "layout cannot have; they do not belong to a ParaFormer config.")
    return per_block


def _ranges(indices: set[int]) -> str:
    ordered = sorted(indices)
    return f"{ordered[0]}..{ordered[-1]} ({len(ordered)} of them)"


def _check_count(name: str, value: Any, low: int, high: int | None, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"in {low}..{high}" if high is not None else f"of at least {low}"
        raise ConfigError(f"--branches {value!r}: {name} must be an integer {span}; {hint}.")
    return value


def _with_layers(config: dict[str, Any], layout: BranchLayout, branches: int) -> dict[str, Any]:
    new = dict(config)
    new["num_branches"] = branches
    new["num_layers"] = branches * layout.layers_per_branch
    # A text config stores routing_groups (= num_layers: route at every block, as branches require).
    if new.get("routing_groups") == layout.num_layers:
        new["routing_groups"] = new["num_layers"]
    return new


# --- compression --------------------------------------------------------------------------------------
def check_keep(config: dict[str, Any], k: int) -> BranchLayout:
    """The config's layout, once k is known to be a number of branches it can keep (1..N)."""
    layout = layout_of(config)
    _check_count("the branches to keep", k, 1, layout.num_branches,
                 f"the model has {layout.num_branches} branches of {layout.layers_per_branch} layers")
    return layout


def compress(config: dict[str, Any], state: dict[str, Tensor], k: int) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config, state) of the first k branches: num_branches k, num_layers k*L, the per-block entries of
    blocks >= k*L dropped. k = 1 gives a plain sequential model of L layers."""
    layout = check_keep(config, k)
    per_block = per_block_lists(state, layout)
    keep_below = k * layout.layers_per_branch
    new_state = {}
    for key, tensor in state.items():
        found = block_index(key)
        if found and found[0] in per_block and found[1] >= keep_below:
            continue
        new_state[key] = tensor
    return _with_layers(config, layout, k), new_state


# --- expansion ----------------------------------------------------------------------------------------
def expanded_config(config: dict[str, Any], m: int) -> dict[str, Any]:
    """The config with m branches of the same depth (m > the current count)."""
    layout = layout_of(config)
    _check_count("the new number of branches", m, layout.num_branches + 1, None,
                 f"the model has {layout.num_branches} already (to keep fewer, compress)")
    return _with_layers(config, layout, m)


@dataclass
class Expansion:
    config: dict[str, Any]
    state: dict[str, Tensor]
    new_keys: list[str]  # the new branches' entries, from the fresh model


def expand(config: dict[str, Any], state: dict[str, Tensor], m: int, fresh: dict[str, Tensor]) -> Expansion:
    """The model with m branches: every old weight kept, the new blocks' entries taken from `fresh`, the
    global state dict of a freshly initialised model of `expanded_config(config, m)`."""
    layout = layout_of(config)
    new_config = expanded_config(config, m)
    per_block = per_block_lists(state, layout)
    new_keys = []
    for key in fresh:
        found = block_index(key)
        if found and found[0] in per_block and found[1] >= layout.num_layers:
            new_keys.append(key)
    carried = set(fresh) - set(new_keys)
    missing, unknown = sorted(carried - set(state)), sorted(set(state) - carried)
    wrong = sorted(k for k in carried & set(state) if tuple(fresh[k].shape) != tuple(state[k].shape))
    if missing or unknown or wrong:
        raise CheckpointError(f"the weights do not fit their config: missing {missing[:5]}, unexpected {unknown[:5]}, "
                              f"wrong shapes {wrong[:5]}; use the config the weights were saved with.")
    if not new_keys:
        raise CheckpointError("the fresh model has no new per-block entries; it was not built from the expanded "
                              "config.")
    merged = {key: state[key] if key in state else fresh[key] for key in fresh}
    return Expansion(new_config, merged, new_keys)

