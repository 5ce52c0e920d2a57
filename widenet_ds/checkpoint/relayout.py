"""A shape-free training state (checkpoint/shape_free.py) put into a freshly built engine of any layout: any world
size, this rank's `ep_size`, ZeRO 0/1/2, fp32 or bf16. Then the engine's own `save_checkpoint` writes the tag of
that layout, and `--resume` on another shape continues from it (`resume_on_new_shape`).

Where the masters go, by the engine's optimizer:
- fp32 without ZeRO: the module's parameters are the masters, the optimizer's state is per tensor;
- bf16 without ZeRO: DeepSpeed's `FP16_UnfusedOptimizer` keeps one fp32 copy per parameter (`fp32_groups`, the
  same positions as the module's `fp16_groups`), the optimizer's state per copy;
- ZeRO 1/2 (fp32 or bf16): DeepSpeed's tensor-fragment API (`safe_set_full_fp32_param`,
  `safe_set_full_optimizer_state`) puts a whole tensor into whatever partition of the flat fp32 groups holds it.
The module's bf16 weights are the masters rounded to bf16, as DeepSpeed's step computes them.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from widenet_ds.checkpoint.manager import TrainingState
from widenet_ds.checkpoint.shape_free import (
    ShapeFreeState,
    fp16_refusal,
    global_expert_name,
    local_experts_of,
    read_shape_free,
    scalar_values,
)
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.errors import CheckpointError


def engine_precision(engine) -> str:
    return "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32"


def apply_to_engine(engine, state: ShapeFreeState, ep_size: int, rank: int) -> None:
    """Put the state into a freshly built engine (fp32 or bf16, ZeRO 0/1/2, any W, this `ep_size`); then the
    engine's `save_checkpoint` writes it in the engine's layout. Every weight of the state must have a place."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    if engine_precision(engine) == "fp16":
        raise CheckpointError(f"{fp16_refusal('this engine is fp16')}; resume in fp32 or bf16.")
    local_experts = local_experts_of(state, ep_size)
    local_names = [n for n, _ in engine.module.named_parameters()]
    named = {global_expert_name(n, rank % ep_size, local_experts): p for n, p in engine.module.named_parameters()}
    every = {global_expert_name(n, e, local_experts) for n in local_names for e in range(ep_size)}
    if every != set(state.master):
        raise CheckpointError(f"the engine's model (ep_size {ep_size}) and the state differ in their weights: "
                              f"{sorted(every ^ set(state.master))[:5]}; build the engine from the state's model "
                              f"config.")
    by_param = {id(p): n for n, p in named.items()}
    with torch.no_grad():
        for name, param in named.items():
            param.copy_(state.master[name])  # bf16: rounded as DeepSpeed rounds its masters after a step
        if engine.zero_optimization_stage() == 0:
            _into_whole_tensors(engine.optimizer, state, by_param)
        else:
            zero = engine.optimizer
            for index, partition in enumerate(zero.single_partition_of_fp32_groups):
                names = [by_param[id(p)] for p in zero.bit16_groups[index]]
                zero.optimizer.param_groups[index].update(_one_hyper(state, names))
                scalars = {json.dumps(state.param_state[n], sort_keys=True) for n in names}
                if len(scalars) != 1:
                    raise CheckpointError(f"the tensors of one ZeRO partition have different optimizer steps "
                                          f"({sorted(scalars)}); a flat partition holds one.")
                zero.optimizer.state[partition] = {**scalar_values(json.loads(scalars.pop())),
                                                   **{what: torch.zeros_like(partition) for what in state.optimizer}}
            zero._lazy_init_hp_params_optimizer_state()
            for name, param in named.items():
                safe_set_full_fp32_param(param, state.master[name])
                for what, tensors in state.optimizer.items():
                    safe_set_full_optimizer_state(param, tensors[name], what)
    scalars = state.scalars
    if engine.lr_scheduler is not None and scalars.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(scalars["lr_scheduler"])
    engine.global_steps = scalars["global_steps"]
    engine.global_samples = scalars["global_samples"]
    engine.skipped_steps = scalars["skipped_steps"]


def _into_whole_tensors(wrapper, state: ShapeFreeState, by_param: dict[int, str]) -> None:
    """Without ZeRO: the optimizer's tensors are the module's parameters (fp32) or fp32 copies of them at the same
    positions (`FP16_UnfusedOptimizer` under bf16); each gets its master and its state."""
    copies = getattr(wrapper, "fp32_groups", None)
    optimizer = wrapper if copies is None else wrapper.optimizer
    for index, group in enumerate(optimizer.param_groups):
        modules = group["params"] if copies is None else wrapper.fp16_groups[index]
        names = [by_param[id(p)] for p in modules]
        group.update(_one_hyper(state, names))
        for tensor, name in zip(group["params"], names, strict=True):
            if copies is not None:
                tensor.copy_(state.master[name])
            optimizer.state[tensor] = {**scalar_values(state.param_state[name]),
                                       **{what: t[name].clone() for what, t in state.optimizer.items()}}


def _one_hyper(state: ShapeFreeState, names: list[str]) -> dict[str, Any]:
    """The hyper-parameters the tensors of one param group share in the state (lr, weight_decay, betas, ...)."""
    found = {json.dumps(state.hyper[n], sort_keys=True) for n in names}
    if len(found) != 1:
        raise CheckpointError(f"the tensors of one param group had different hyper-parameters in the checkpoint: "
                              f"{sorted(found)}")
    hyper = json.loads(found.pop())
    return {k: tuple(v) if isinstance(v, list) else v for k, v in hyper.items()}


def resume_on_new_shape(engine, source: CheckpointSource, loader, ep_size: int, rank: int) -> TrainingState:
    """Continue a run from `source` (written on another shape, or resharded with its shape-free state) in this
    rank's freshly built engine and loader: weights, optimizer state, schedule and the data position. Every rank
    reads the whole checkpoint (nothing of it is modified); the RNG streams of the old ranks mean nothing on the
    new ones and are not restored. `source` was opened for --resume on every rank (marker read, files checked)."""
    state = read_shape_free(source)
    apply_to_engine(engine, state, ep_size, rank)
    positions = {(s["epoch"], s.get("consumed")) for s in state.scalars["loaders"]}
    if len(positions) != 1:
        raise CheckpointError(f"the ranks of {source.tag_dir} saved different data positions {sorted(positions)}; a "
                              f"checkpoint is taken between steps, where every rank has consumed as much: the folder "
                              f"is mixed up.")
    loader.load_state_dict(state.scalars["loaders"][0])
    return TrainingState(step=source.meta.step, samples=source.meta.samples)
