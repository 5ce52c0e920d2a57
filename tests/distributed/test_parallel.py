"""The parallel plan, checked once before anything is built: expert parallelism against the world and the
experts, branch parallelism against the branches, the world, expert parallelism and the DeepSpeed set-up."""

from __future__ import annotations

import pytest

from widenet_ds.distributed.parallel import ParallelPlan
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


def test_the_plan_refuses_a_layout_the_world_cannot_form():
    """The start-up's plan makes distributed/layout_checks.py's checks (their cases: test_layout_checks.py)."""
    with pytest.raises(ConfigError, match=r"--ep-size 2 does not divide the 3 rank"):
        ParallelPlan.plan(world_size=3, rank=0, ep_size=2, branch_parallel=1, model_config=WIDENET)


def test_branch_parallel_needs_fp32_zero_stage_0():
    plan = ParallelPlan.plan(world_size=2, rank=0, ep_size=1, branch_parallel=2, model_config=PARAFORMER)
    with pytest.raises(ConfigError, match=r"fp32 ZeRO stage 0 only \(zero_optimization.stage is 1: set it to 0\)"):
        plan.check_deepspeed(settings(1, zero_optimization={"stage": 1}))
