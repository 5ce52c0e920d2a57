"""build_engine: which optimizer runs for a JSON, MoE parameter groups, and real steps on CPU."""

from __future__ import annotations

import pytest
import torch

from tests.support.launching import REPO
from widenet_ds.engine.build import build_engine, optimizer_op, plan_optimizer
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.engine.lamb import Lamb
from widenet_ds.errors import ConfigError
from widenet_ds.model.config import ModelConfig

LAMB_JSON = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9,
             "optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}},
             "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_num_steps": 2,
                                                               "warmup_max_lr": 0.01, "warmup_type": "linear"}},
             "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}


def settings(config, cuda=False):
    return validate_ds_config(config, world_size=1, has_moe=True, cuda_available=cuda)


def tiny_model():
    from widenet_ds.model.widenet import WideNetForPreTraining

    torch.manual_seed(0)
    return WideNetForPreTraining(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=200,
                                                         max_position_embeddings=32))


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (4, 16), generator=g)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_labels": torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, -100),
            "sop_labels": torch.randint(0, 2, (4,), generator=g)}


def test_lamb_runs_as_torch_lamb_on_cpu_and_fused_only_where_it_is_per_tensor():
    assert plan_optimizer(settings(LAMB_JSON), "auto", cuda_available=False).implementation == "torch-lamb"
    assert plan_optimizer(settings(LAMB_JSON, cuda=True), "auto", cuda_available=True).implementation == "torch-lamb"
    stage0 = {**LAMB_JSON, "zero_optimization": {"stage": 0}}
    assert plan_optimizer(settings(stage0, cuda=True), "auto", cuda_available=True).implementation == "deepspeed"
    assert plan_optimizer(settings(LAMB_JSON), "torch-lamb", cuda_available=False).implementation == "torch-lamb"



def gpu_op(config, choice="auto"):
    ds = settings(config, cuda=True)
    return optimizer_op(ds, plan_optimizer(ds, choice, cuda_available=True))


def test_the_op_each_optimizer_loads_on_a_gpu_node():
    assert gpu_op(LAMB_JSON) is None  # ZeRO 1: our LAMB
    assert gpu_op(LAMB_JSON, "deepspeed-fused") == "fused_lamb"
    assert gpu_op({**LAMB_JSON, "zero_optimization": {"stage": 0}}) == "fused_lamb"
    adamw = {**LAMB_JSON, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    assert gpu_op(adamw) == "fused_adam"
    assert gpu_op({**adamw, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}) is None
    offloaded = {**adamw, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    assert gpu_op(offloaded) == "cpu_adam"
    sgd = {**LAMB_JSON, "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
    assert gpu_op(sgd) is None
    # the README's GPU recipe builds no optimizer op; the GLUE recipes DeepSpeed's FusedAdam
    assert gpu_op(load_ds_config(REPO / "ds_configs/pretrain_phase1_seq128_lamb_zero1_bf16.json")) is None
    assert gpu_op(load_ds_config(REPO / "ds_configs/finetune_sst2.json")) == "fused_adam"

def test_impossible_optimizer_choices_are_refused():
    with pytest.raises(ConfigError, match="deepspeed-fused needs a CUDA device"):
        plan_optimizer(settings(LAMB_JSON), "deepspeed-fused", cuda_available=False)
    adamw = {**LAMB_JSON, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    with pytest.raises(ConfigError, match="asks for 'AdamW'"):
        plan_optimizer(settings(adamw), "torch-lamb", cuda_available=False)
    no_optimizer = {k: v for k, v in LAMB_JSON.items() if k not in ("optimizer", "scheduler")}
    with pytest.raises(ConfigError, match="no \"optimizer\" section"):
        plan_optimizer(settings(no_optimizer), "auto", cuda_available=False)


def test_torch_lamb_engine_has_moe_groups_and_the_json_schedule(dist):
    engine, plan = build_engine(tiny_model(), settings(LAMB_JSON))
    assert plan.implementation == "torch-lamb"
    assert isinstance(engine.optimizer.optimizer, Lamb)  # inside DeepSpeed's ZeRO stage-1 wrapper
    assert engine.optimizer.optimizer._layouts, "per-tensor trust ratio was not enabled under ZeRO"
    groups = engine.basic_optimizer.param_groups
    assert {g["weight_decay"] for g in groups} == {0.01, 0.0}
    assert any(g.get("moe") for g in groups), "expert parameters need their own MoE group"
    lrs = []
    for step in range(3):
        lrs.append(engine.get_lr()[0])
        out = engine(**batch(step))
        engine.backward(out.loss)
        engine.step()
    # WarmupDecayLR from the JSON, linear warmup over 2 steps (DeepSpeed starts at warmup_min_lr twice).
    assert lrs == pytest.approx([0.0, 0.0, 0.005])
    assert engine.global_steps == 3


def test_a_non_lamb_json_optimizer_is_built_by_deepspeed(dist):
    adamw = {**LAMB_JSON, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
             "zero_optimization": {"stage": 0}}
    engine, plan = build_engine(tiny_model(), settings(adamw))
    assert plan.implementation == "deepspeed"
    assert isinstance(engine.optimizer, torch.optim.AdamW)
    before = [p.detach().clone() for p in engine.module.parameters()]
    for step in range(3):
        out = engine(**batch(step))
        engine.backward(out.loss)
        engine.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))


def test_a_bf16_engine_without_zero_runs_lamb_on_fp32_copies_from_the_first_step(dist):
    """bf16 (or fp16) with ZeRO 0: DeepSpeed's optimizer swaps Lamb's tensors for fp32 copies and steps once with
    zero gradients in its constructor. The copies are whole tensors, and that step (for LAMB a weight-decay update
    at the full rate) is undone: the masters are the 16-bit weights, no optimizer state, until the first step."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    bf16 = {**LAMB_JSON, "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}
    engine, plan = build_engine(tiny_model(), settings(bf16))
    assert plan.implementation == "torch-lamb" and isinstance(engine.optimizer, FP16_UnfusedOptimizer)
    lamb = engine.optimizer.optimizer
    assert not lamb.state
    for masters, weights in zip(engine.optimizer.fp32_groups, engine.optimizer.fp16_groups, strict=True):
        assert all(torch.equal(m, w.float()) for m, w in zip(masters, weights, strict=True))
    for step in range(2):
        out = engine(**batch(step))
        engine.backward(out.loss)
        engine.step()
    steps = {state["step"] for state in lamb.state.values()}
    assert steps == {2} and len(lamb.state) == sum(len(g) for g in engine.optimizer.fp32_groups)
