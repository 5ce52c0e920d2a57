"""The one place that calls `deepspeed.initialize`: parameter groups, the optimizer, the schedule.

The DeepSpeed JSON decides the optimizer type, its hyper-parameters and the LR schedule. What we
add: BERT's no-decay groups (biases, LayerNorms) split into DeepSpeed's MoE groups, and -- when the
JSON asks for `Lamb` -- the choice between DeepSpeed's fused CUDA kernel and our PyTorch LAMB
(`widenet_ds.engine.lamb.Lamb`, same hyper-parameters and update rule, per-tensor trust ratio also under
ZeRO 1/2), because the fused kernel cannot run on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from deepspeed.moe.utils import is_moe_param
from torch import nn

from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.engine.ds_sections import offload_device
from widenet_ds.engine.lamb import (
    Lamb,
    build_param_groups,
    enable_per_tensor_trust_ratio,
)
from widenet_ds.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimizerPlan:
    """Which optimizer implementation runs, and why (logged at start-up)."""

    implementation: str  # "deepspeed" (built by DeepSpeed from the JSON) | "torch-lamb"
    reason: str


def plan_optimizer(settings: DeepSpeedSettings, choice: str, cuda_available: bool) -> OptimizerPlan:
    """Resolve --optimizer against the JSON's optimizer type and the device."""
    if settings.optimizer_type is None:
        raise ConfigError("the DeepSpeed config has no \"optimizer\" section; add one, e.g. "
                          "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.00176, \"weight_decay\": 0.01}} "
                          "(see ds_configs/).")
    if not settings.uses_lamb:
        if choice != "auto":
            raise ConfigError(f"--optimizer {choice} picks a LAMB implementation, but the DeepSpeed config asks "
                              f"for {settings.optimizer_type!r}; drop --optimizer or set the JSON's type to Lamb.")
        return OptimizerPlan("deepspeed", f"{settings.optimizer_type} built by DeepSpeed from the JSON")
    if choice == "deepspeed-fused":
        if not cuda_available:
            raise ConfigError("--optimizer deepspeed-fused needs a CUDA device (DeepSpeed's Lamb is a fused CUDA "
                              "kernel); on CPU use --optimizer torch-lamb or auto.")
        return OptimizerPlan("deepspeed", "Lamb: DeepSpeed's fused CUDA kernel, as asked")
    if choice == "torch-lamb":
        return OptimizerPlan("torch-lamb", "Lamb: widenet_ds.engine.lamb.Lamb, as asked")
    if not cuda_available:
        return OptimizerPlan("torch-lamb", "Lamb: DeepSpeed's fused kernel needs CUDA, so the JSON's Lamb "
                                           "hyper-parameters run in widenet_ds.engine.lamb.Lamb")
    if settings.zero_stage > 0:
        # Under ZeRO the fused kernel sees flat partitions, so its trust ratio is per partition.
        return OptimizerPlan("torch-lamb", f"Lamb under ZeRO stage {settings.zero_stage}: widenet_ds.engine.lamb.Lamb "
                                           "keeps the trust ratio per tensor (the fused kernel's is per partition)")
    return OptimizerPlan("deepspeed", "Lamb: DeepSpeed's fused CUDA kernel (ZeRO stage 0: per-tensor trust ratio)")



def optimizer_op(settings: DeepSpeedSettings, plan: OptimizerPlan) -> str | None:
    """The DeepSpeed op that `plan`'s optimizer loads when DeepSpeed builds it (its builder's name, as `ds_report`
    lists it; `DS_BUILD_<NAME>` pre-builds it at install, docs/gpu.md), JIT-built at its first use otherwise;
    None for torch's optimizers and ours. DeepSpeed's choice (`_configure_basic_optimizer`): its fused kernels on
    the device, its CPU optimizers under ZeRO-Offload, torch's Adam with `"torch_adam": true`."""
    if plan.implementation != "deepspeed" or settings.optimizer_type is None:
        return None
    kind = settings.optimizer_type.lower()
    offloaded = offload_device(settings.config) in ("cpu", "nvme")
    if kind == "lamb":
        return "fused_lamb"
    if kind in ("adam", "adamw", "muon"):  # Muon's own Adam half is DeepSpeed's Adam
        if (settings.config["optimizer"].get("params") or {}).get("torch_adam"):
            return None
        return "cpu_adam" if offloaded else "fused_adam"
    if kind == "lion":
        return "cpu_lion" if offloaded else "fused_lion"
    if kind == "adagrad":
        return "cpu_adagrad" if offloaded else None  # torch's Adagrad on the device
    return None  # mup's optimizers, torch.optim's

def build_engine(model: nn.Module, settings: DeepSpeedSettings, optimizer_choice: str = "auto",
                 config: dict | None = None):
    """Wrap `model` in a DeepSpeed engine as the validated JSON says; returns (engine, plan). `config`: the
    JSON as DeepSpeed is to see it, when the parallel layout adjusts it (default: the validated one)."""
    import deepspeed

    plan = plan_optimizer(settings, optimizer_choice, torch.cuda.is_available())
    config = copy.deepcopy(settings.config if config is None else config)  # DeepSpeed keeps and may edit it
    config.pop("_comment", None)
    optimizer_params = dict(config["optimizer"].get("params", {}))
    groups = build_param_groups(model, weight_decay=optimizer_params.get("weight_decay", 0.0))
    optimizer = None
    if plan.implementation == "torch-lamb":
        del config["optimizer"]  # DeepSpeed must not build a second optimizer from the JSON
        optimizer = Lamb(groups, **optimizer_params)
    logger.info("optimizer: %s", plan.reason)
    # DeepSpeed's MoE prints "No existing process group found, creating ..." on every rank (a bare print);
    # its logger writes to the stream it was created with, so warnings still reach the console.
    with contextlib.redirect_stdout(io.StringIO()):
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, optimizer=optimizer,
                                               config=config)
    if plan.implementation == "torch-lamb":
        enable_per_tensor_trust_ratio(engine)
    return engine, plan


def expert_grad_norm_stage0(model: torch.nn.Module, ep_size: int) -> float:
    """Global gradient 2-norm without ZeRO, where DeepSpeed does not compute one (fp32, stage 0).
    Dense gradients are already averaged over ranks; each expert's gradient lives on the ranks of its
    expert-parallel position, replicated world / ep_size times."""
    dense = torch.zeros((), dtype=torch.float64)
    experts = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        if p.grad is not None:
            square = p.grad.detach().double().square().sum().cpu()
            if is_moe_param(p):
                experts += square
            else:
                dense += square
    world = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
    if world > 1:
        torch_dist.all_reduce(experts)
        experts /= world // ep_size
    return float((dense + experts).sqrt())
