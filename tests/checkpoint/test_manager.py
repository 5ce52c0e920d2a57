"""Checkpoint bookkeeping (checkpoint/manager.py): the RNG round trip and keep-last-K pruning of partial and stale
tags. (Whole save/kill/resume runs are in tests/integration/test_pretrain_resume.py.)"""

from __future__ import annotations

import random

import numpy as np
import torch

from widenet_ds.checkpoint.manager import CheckpointManager, rng_state, set_rng_state

from tests.support.run_folders import make_tag


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.randn(2).tolist()


def test_rng_state_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draws()
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = draws()
    draws()  # move every generator on
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected


def test_pruning_keeps_the_last_k_complete_and_drops_partial_and_stale_ones(tmp_path):
    for step in (10, 20, 30, 40):
        make_tag(tmp_path, step)
    make_tag(tmp_path, 35, complete=False)  # a save killed half-way
    make_tag(tmp_path, 50)  # from an earlier attempt that got further than the run being resumed
    CheckpointManager(tmp_path, keep_last=2, rank=0, world_size=1)._prune(current_step=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step30", "step40"]


def test_the_size_estimate_counts_the_experts_once_per_expert_parallel_rank():
    """`estimate_checkpoint_bytes` finds the experts by DeepSpeed's own mark (not all-reduced): exactly the
    parameters the portable format names experts, each held ep_size times over the ranks."""
    from deepspeed.moe.utils import is_moe_param

    from widenet_ds.checkpoint.manager import OPTIMIZER_BYTES_PER_PARAM, estimate_checkpoint_bytes
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.portable.format import is_expert_key

    model = WideNetForPreTraining(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000))
    marked = {name for name, p in model.named_parameters() if is_moe_param(p)}
    assert marked and marked == {name for name, _ in model.named_parameters() if is_expert_key(name)}
    expert_bytes = sum(p.numel() * (p.element_size() + OPTIMIZER_BYTES_PER_PARAM)
                       for p in model.parameters() if is_moe_param(p))
    assert estimate_checkpoint_bytes(model, 4) - estimate_checkpoint_bytes(model, 1) == 3 * expert_bytes
