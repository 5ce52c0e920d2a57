"""The bytes a rank's DeepSpeed engine holds of the model: its weights, gradients, fp32 master weights and optimizer
states, for the JSON's ZeRO stage and precision, by DeepSpeed's own rules (deepspeed 0.19.8).

What `deepspeed.initialize` builds, and so what is counted here:
  - ZeRO 0, fp32: the client optimizer on the module's own parameters and gradients;
  - ZeRO 0, bf16/fp16: the module cast to 16 bits, its gradients in 16 bits, one fp32 master copy per parameter
    (`FP16_UnfusedOptimizer`; `FP16_Optimizer`'s flat copies are the same bytes), the optimizer on the copies;
  - ZeRO 1 and 2 (`DeepSpeedZeroOptimizer`): each optimizer parameter group flattened into one buffer padded to a
    multiple of 2 x its data-parallel ranks (`align_dense_tensors`), split into equal partitions, this rank's partition
    copied to fp32 and the optimizer on it; the gradients of the parameters that touch this rank's partition kept in
    one contiguous buffer of the model's precision from the backward to the step; during each backward a reduce
    bucket of `reduce_bucket_size` elements (two with overlap_comm) when contiguous_gradients is on.
The expert parameters are groups of their own (`split_params_into_different_moe_groups_for_optimizer`), partitioned
over their expert-data-parallel ranks. DeepSpeed's own functions lay the groups out (on the meta device: no bytes).

A layout DeepSpeed builds otherwise (ZeRO 3, offload, a `data_types.grad_accum_dtype` unlike the model's, an optimizer
whose state is not known here) raises `Unmodelled` with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from deepspeed.runtime.utils import align_dense_tensors
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from torch._utils import _flatten_dense_tensors

from widenet_ds.engine.ds_config import DeepSpeedSettings

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
NCCL_START_ALIGNMENT_FACTOR = 2  # DeepSpeedZeroOptimizer.nccl_start_alignment_factor: 4-byte alignment of 16 bits

# Optimizer state per fp32 element it updates, and per tensor it updates (torch's Adam keeps its step count in a
# 4-byte tensor; LAMB and DeepSpeed's fused kernels keep it as a Python int).
OPTIMIZER_STATE = {
    "lamb": (8, 0),        # exp_avg, exp_avg_sq (widenet_ds.engine.lamb.Lamb and DeepSpeed's FusedLamb)
    "torch-adam": (8, 4),  # torch.optim.Adam/AdamW: exp_avg, exp_avg_sq, step
    "fused-adam": (8, 0),  # DeepSpeed's FusedAdam (a GPU's Adam/AdamW)
    "sgd-momentum": (4, 0),
    "sgd": (0, 0),
}


class Unmodelled(Exception):
    """A DeepSpeed layout this model does not count (the message says which and why)."""


@dataclass(frozen=True)
class ParamGroup:
    """One optimizer parameter group as DeepSpeed partitions it on one rank."""

    numels: tuple[int, ...]
    data_parallel_size: int  # ranks it is partitioned over (experts: their expert-data-parallel group)
    partition_id: int        # this rank's place among them
    moe: bool = False


@dataclass(frozen=True)
class ModelStateBytes:
    weights: int
    gradients: int           # held from the step's backward to its optimizer step
    master_weights: int      # the fp32 copies DeepSpeed updates (0: the optimizer updates the weights themselves)
    optimizer_states: int
    reduce_buckets: int = 0  # held during each backward only
    step_gradients: int = 0  # held during the optimizer step only: the fp32 gradient of the largest partition

    @property
    def held(self) -> int:
        """What the engine holds between steps and through them."""
        return self.weights + self.gradients + self.master_weights + self.optimizer_states


def optimizer_state_kind(ds: DeepSpeedSettings, implementation: str, cuda: bool) -> str:
    """The key of OPTIMIZER_STATE for the optimizer that runs (`implementation`: engine/build.py's OptimizerPlan)."""
    name = (ds.optimizer_type or "").lower()
    if name == "lamb":
        return "lamb"
    if name in ("adam", "adamw"):
        return "fused-adam" if cuda and implementation == "deepspeed" else "torch-adam"
    if name == "sgd":
        momentum = ((ds.config.get("optimizer") or {}).get("params") or {}).get("momentum", 0)
        return "sgd-momentum" if momentum else "sgd"
    raise Unmodelled(f"the state of optimizer {ds.optimizer_type!r} is not counted here")


def zero_partition(group: ParamGroup, dtype: torch.dtype, round_robin: bool) -> tuple[int, int, int]:
    """(flat buffer, partition, gradient elements held), in elements, as DeepSpeedZeroOptimizer lays the group out:
    the gradient of every parameter touching this rank's partition whole, and zeros for the partition's padding
    (`get_flat_partition`)."""
    tensors = [torch.empty(n, dtype=dtype, device="meta") for n in group.numels]
    if round_robin:
        tensors, _ = DeepSpeedZeroOptimizer._round_robin_reorder(None, tensors, group.data_parallel_size)
    alignment = NCCL_START_ALIGNMENT_FACTOR * group.data_parallel_size
    flat = _flatten_dense_tensors(align_dense_tensors(tensors, alignment)).numel()
    partition = flat // group.data_parallel_size
    touching, _, _ = DeepSpeedZeroOptimizer.get_partition_info(None, tensors, partition, group.partition_id)
    padding = partition - min(partition, max(0, sum(group.numels) - partition * group.partition_id))
    return flat, partition, sum(t.numel() for t in touching) + padding


def model_state_bytes(groups: list[ParamGroup], ds: DeepSpeedSettings, state_kind: str) -> ModelStateBytes:
    """The engine's bytes on the rank whose parameter groups are `groups` (non-empty, in the optimizer's order)."""
    zero = DeepSpeedZeroConfig(**(ds.config.get("zero_optimization") or {}))
    per_element, per_tensor = OPTIMIZER_STATE[state_kind]
    weight_bytes = BYTES[ds.precision]
    grad_accum = (ds.config.get("data_types") or {}).get("grad_accum_dtype")
    if grad_accum is not None and BYTES.get({"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                                             "fp16": "fp16", "float16": "fp16"}.get(grad_accum, ""), 0) != weight_bytes:
        raise Unmodelled(f"data_types.grad_accum_dtype {grad_accum} with {ds.precision} weights (DeepSpeed then keeps "
                         f"separate accumulation buffers) is not counted here")
    if zero.offload_optimizer is not None and zero.offload_optimizer.device != "none":
        raise Unmodelled("ZeRO-Offload (zero_optimization.offload_optimizer) is not counted here")
    numel = sum(sum(g.numels) for g in groups)
    tensors = sum(len(g.numels) for g in groups)
    if ds.zero_stage == 0:
        master = 0 if ds.precision == "fp32" else 4 * numel
        return ModelStateBytes(weights=weight_bytes * numel, gradients=weight_bytes * numel, master_weights=master,
                               optimizer_states=per_element * numel + per_tensor * tensors,
                               step_gradients=0 if ds.precision == "fp32" else 4 * numel)
    if ds.zero_stage not in (1, 2):
        raise Unmodelled(f"ZeRO stage {ds.zero_stage} is not counted here")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[ds.precision]
    layouts = [zero_partition(g, dtype, zero.round_robin_gradients) for g in groups]
    partitions = [partition for _, partition, _ in layouts]
    buckets = (2 if zero.overlap_comm else 1) * int(zero.reduce_bucket_size) if zero.contiguous_gradients else 0
    return ModelStateBytes(
        weights=weight_bytes * sum(flat for flat, _, _ in layouts),
        gradients=weight_bytes * sum(touching for _, _, touching in layouts),
        master_weights=4 * sum(partitions),
        optimizer_states=per_element * sum(partitions) + per_tensor * len(groups),
        reduce_buckets=weight_bytes * buckets,
        step_gradients=max(partitions) * (4 + (weight_bytes if ds.precision != "fp32" else 0)))
