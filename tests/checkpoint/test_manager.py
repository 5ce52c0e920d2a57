"""Checkpoint bookkeeping (checkpoint/manager.py): the RNG round trip and keep-last-K pruning of partial and stale
tags. (Whole save/kill/resume runs are in tests/integration/test_pretrain_resume.py.)"""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from widenet_ds.checkpoint.manager import CheckpointManager, rng_state, set_rng_state
from widenet_ds.checkpoint.marker import META_FILE


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


def make_tag(root, step, complete=True):
    tag = root / f"step{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    if complete:
        (tag / META_FILE).write_text(json.dumps({"step": step}))
    return tag


def test_pruning_keeps_the_last_k_complete_and_drops_partial_and_stale_ones(tmp_path):
    for step in (10, 20, 30, 40):
        make_tag(tmp_path, step)
    make_tag(tmp_path, 35, complete=False)  # a save killed half-way
    make_tag(tmp_path, 50)  # from an earlier attempt that got further than the run being resumed
    CheckpointManager(tmp_path, keep_last=2, rank=0, world_size=1)._prune(current_step=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step30", "step40"]
