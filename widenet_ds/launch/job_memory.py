"""A pretraining job's memory per device, as its ranks' DeepSpeed engines will hold it: the model's weights,
gradients, fp32 master weights and optimizer states of each rank by DeepSpeed's rules (engine/memory.py), for the
model built on the meta device with the job's expert parallelism; the activations of one micro-batch, counted on
fake tensors (engine/activation_memory.py) with rank 0's expert-parallel group on torch's fake process group."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from widenet_ds.engine.activation_memory import (
    fake_engine_module,
    step_activation_bytes,
)
from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.engine.lamb import build_param_groups
from widenet_ds.engine.memory import (
    ModelStateBytes,
    ParamGroup,
    Unmodelled,
    model_state_bytes,
    optimizer_state_kind,
)
from widenet_ds.launch.job_shape import JobShape
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.widenet import WideNetForPreTraining


@dataclass(frozen=True)
class DeviceMemory:
    """One rank's bytes."""

    rank: int
    states: ModelStateBytes
    activations: int
    reduce_buckets: int  # of states.reduce_buckets, what the device holds (a CPU touches only what gradients fill)

    @property
    def peak(self) -> int:
        return self.states.held + max(self.activations + self.reduce_buckets, self.states.step_gradients)


def device_memory(rank: int, states: ModelStateBytes, activations: int, gpus: bool) -> DeviceMemory:
    """A GPU holds DeepSpeed's reduce buckets whole; a CPU rank's pages of them are touched only as far as one
    gradient of each parameter fills them."""
    return DeviceMemory(rank, states, activations,
                        states.reduce_buckets if gpus else min(states.reduce_buckets, states.weights))


def init_fake_world(world: int) -> None:
    """torch's fake process group of the job's world, this process its rank 0: the experts' all-to-all on fake
    tensors runs on it and moves nothing."""
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)



def meta_model(model_config, ep_size: int) -> WideNetForPreTraining:
    """The model of the job's rank 0, built on the meta device (no weights allocated)."""
    with torch.device("meta"):
        return WideNetForPreTraining(model_config, ep_size=ep_size)


def pretraining_activations(model_config, ds: DeepSpeedSettings, shape: JobShape, micro: int, seq: int,
                            checkpointing: bool, gpus: bool) -> int:
    """The activations' bytes of one micro-batch of `micro` sequences of `seq` tokens, laid out as the engine lays
    the model out (a GPU's engine moves it to the device: the experts' packed weights each get a storage)."""
    if model_config.is_moe and model_config.moe.dispatch == "deepspeed" and shape.ep_size > 1:
        raise Unmodelled("the activations of moe.dispatch deepspeed across expert-parallel ranks (its all-to-all "
                         "runs through DeepSpeed's communication backend, which a dry run does not start)")
    model = meta_model(model_config, shape.ep_size)
    model.set_activation_checkpointing(checkpointing)
    # Rank 0's expert-parallel group, on the fake process group (DeepSpeed makes it through its communication
    # backend, whose start builds and loads a CPU op: the dry run starts nothing and writes nothing).
    group = torch_dist.new_group(shape.expert_parallel_groups[0])
    for module in model.modules():
        if isinstance(module, MoEFeedForward):
            module.moe.deepspeed_moe._set_ep_group(group)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_engine_module(model, lambda m: [g["params"] for g in build_param_groups(m, 0.0)], ds.precision,
                       ds.zero_stage, gpus, mode)

    def forward(module):
        ids = torch.randint(0, model_config.vocab_size, (micro, seq))
        labels = torch.where(torch.rand(micro, seq) < 0.15, ids, torch.full_like(ids, -100))
        return module(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=torch.ones_like(ids),
                      mlm_labels=labels, sop_labels=torch.zeros(micro, dtype=torch.long))

    return step_activation_bytes(model, forward, lambda output: output.loss, mode)


def rank_param_groups(model, shape: JobShape, rank: int, weight_decay: float) -> list[ParamGroup]:
    """`rank`'s optimizer parameter groups (engine/lamb.py's, as build_engine makes them) as ZeRO partitions them:
    the dense groups over every rank, the experts' over their expert-data-parallel ranks."""
    groups = []
    for group in build_param_groups(model, weight_decay):
        if group.get("moe"):
            size, place = shape.expert_data_parallel_place(rank)
        else:
            size, place = shape.world_size, rank
        groups.append(ParamGroup(tuple(p.numel() for p in group["params"]), size, place, bool(group.get("moe"))))
    return groups


def model_states(model_config, shape: JobShape, ds: DeepSpeedSettings, optimizer_implementation: str,
                 gpus: bool) -> list[ModelStateBytes]:
    """Each rank's engine bytes for the model under the DeepSpeed settings `ds` (the plan's, or a changed JSON's),
    with the optimizer that runs (engine/build.py's OptimizerPlan.implementation)."""
    model = meta_model(model_config, shape.ep_size)
    weight_decay = ((ds.config.get("optimizer") or {}).get("params") or {}).get("weight_decay", 0.0)
    kind = optimizer_state_kind(ds, optimizer_implementation, gpus)
    return [model_state_bytes(rank_param_groups(model, shape, rank, weight_decay), ds, kind)
            for rank in range(shape.world_size)]
