"""The parallel plan, checked once before anything is built: expert parallelism against the world and the
experts, branch parallelism against the branches, the world, expert parallelism and the DeepSpeed set-up."""

from __future__ import annotations

import pytest

from widenet_ds.distributed.parallel import ParallelPlan, check_ep_size
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.errors import ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.vision.config import VisionConfig

PARAFORMER = VisionConfig.from_preset("paraformer-tiny-3x4")
WIDENET = ModelConfig.from_preset("widenet-tiny-e4")


def settings(world: int, **changes):
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, **changes}
    return validate_ds_config(config, world_size=world, has_moe=False, cuda_available=False)


def test_branch_groups_split_the_world_and_read_one_copy_of_the_data():
    plan = ParallelPlan.plan(world_size=4, rank=3, ep_size=1, branch_parallel=2, model_config=PARAFORMER)
    assert (plan.data_parallel_size, plan.data_parallel_rank) == (2, 1)
    # DeepSpeed counts every rank as data-parallel: its batch check sees twice the JSON's global batch.
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8}
    assert plan.deepspeed_config(config)["train_batch_size"] == 32 and config["train_batch_size"] == 16
    plan.check_deepspeed(settings(2))
    one = ParallelPlan.plan(world_size=2, rank=1, ep_size=2, branch_parallel=1, model_config=WIDENET)
    assert (one.data_parallel_size, one.data_parallel_rank) == (2, 1) and one.deepspeed_config(config) is config


@pytest.mark.parametrize("world, ep, bp, model, message", [
    (2, 1, 2, WIDENET, r"--branch-parallel 2: the model has one branch"),
    (3, 1, 2, PARAFORMER, r"it does not divide the 3 rank\(s\)"),
    (4, 1, 4, PARAFORMER, r"the model has 3 branches, fewer than the 4 ranks of a branch group"),
    (4, 2, 2, VisionConfig.from_preset("widenet-paraformer-tiny-3x4"), r"--ep-size 2\) inside branch groups"),
    (3, 2, 1, WIDENET, r"--ep-size 2 does not divide the 3 rank"),
    (2, 2, 1, ModelConfig.from_preset("albert-tiny"), r"the model is dense"),
])
def test_layouts_that_cannot_work_are_refused_with_the_fix(world, ep, bp, model, message):
    with pytest.raises(ConfigError, match=message):
        ParallelPlan.plan(world_size=world, rank=0, ep_size=ep, branch_parallel=bp, model_config=model)


def test_branch_parallel_needs_fp32_zero_stage_0():
    plan = ParallelPlan.plan(world_size=2, rank=0, ep_size=1, branch_parallel=2, model_config=PARAFORMER)
    with pytest.raises(ConfigError, match=r"fp32 ZeRO stage 0 only \(zero_optimization.stage is 1: set it to 0\)"):
        plan.check_deepspeed(settings(1, zero_optimization={"stage": 1}))


def test_ep_size_must_divide_world_size_and_experts():
    check_ep_size(2, world_size=4, num_experts=8)
    check_ep_size(1, world_size=3, num_experts=None)
    with pytest.raises(ConfigError, match=r"--ep-size 4 does not divide the 2 rank\(s\); use one of \[1, 2\]"):
        check_ep_size(4, world_size=2, num_experts=4)
    with pytest.raises(ConfigError, match=r"--ep-size 2 does not divide the model's 3 experts"):
        check_ep_size(2, world_size=2, num_experts=3)
    with pytest.raises(ConfigError, match=r"the model is dense"):
        check_ep_size(2, world_size=2, num_experts=None)
    with pytest.raises(ConfigError, match=r"positive integer"):
        check_ep_size(0, world_size=2, num_experts=4)
