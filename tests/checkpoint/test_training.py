"""Checkpoint bookkeeping: RNG round trip, config differences, keep-last-K, partial checkpoints, signals.
(Whole save/kill/resume runs are in tests/integration/test_pretrain_resume.py.)"""

from __future__ import annotations

import json
import os
import random
import signal

import numpy as np
import pytest
import torch

from widenet_ds.checkpoint.marker import META_FILE
from widenet_ds.checkpoint.training import (
    CheckpointManager,
    check_same_model,
    config_differences,
    latest_checkpoint,
    resolve_tag_dir,
    rng_state,
    set_rng_state,
)
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import upgrade
from widenet_ds.model.config import ModelConfig
from widenet_ds.training.preemption import StopRequest


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


def test_config_differences_name_each_field_with_both_values():
    widenet = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000).to_dict()
    albert = ModelConfig.from_preset("albert-tiny", vocab_size=1000).to_dict()
    diffs = config_differences(albert, widenet)
    assert "ffn: 'dense' (checkpoint) vs 'moe' (this run)" in diffs
    assert "share_layernorm: True (checkpoint) vs False (this run)" in diffs
    changed = json.loads(json.dumps(widenet))
    changed["moe"]["num_experts"] = 8
    assert config_differences(widenet, changed) == ["moe.num_experts: 4 (checkpoint) vs 8 (this run)"]
    legacy = json.loads(json.dumps(widenet))  # a checkpoint written before 0.2 records run settings in its config
    legacy["activation_checkpointing"], legacy["moe"]["ep_size"] = True, 2
    del legacy["moe"]["capacity_rounding"]  # a field added later takes its default
    marker = upgrade("marker", {"step": 1, "samples": 8, "world_size": 2, "model_config": legacy}, "ckpt")
    assert marker["ep_size"] == 2  # (formats.py moves the run settings out of the config)
    check_same_model(marker["model_config"], widenet, "ckpt")  # they are not model differences
    with pytest.raises(CheckpointError, match=r"another model config; differing fields:\n  moe.num_experts"):
        check_same_model(widenet, changed, "ckpt")


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


def test_latest_must_point_at_a_complete_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    make_tag(tmp_path, 5)
    make_tag(tmp_path, 6, complete=False)
    (tmp_path / "latest").write_text("step5")
    assert latest_checkpoint(tmp_path) == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path) == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path / "step5") == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path, "step5") == tmp_path / "step5"
    (tmp_path / "latest").write_text("step6")
    with pytest.raises(CheckpointError, match="not a complete widenet-ds checkpoint"):
        latest_checkpoint(tmp_path)
    # conversion reads DeepSpeed tag folders without our marker; training never does
    assert resolve_tag_dir(tmp_path, require_marker=False) == tmp_path / "step6"
    with pytest.raises(CheckpointError, match="tag 'step7' does not exist"):
        resolve_tag_dir(tmp_path, "step7")
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_tag_dir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no widenet-ds checkpoint at"):
        resolve_tag_dir(tmp_path / "empty")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_stop_request_catches_preemption_signals(sig):
    before = signal.getsignal(sig)
    stop = StopRequest()
    stop.install()
    try:
        assert not stop.agreed()
        os.kill(os.getpid(), sig)
        assert stop.agreed() and stop.signal_name == signal.Signals(sig).name
    finally:
        stop.uninstall()
    assert signal.getsignal(sig) == before


def test_stop_request_takes_term_only_once_asked_and_restores_both():
    """run_task catches USR1 from the start and TERM only after the rendezvous (training/run.py)."""
    before = {sig: signal.getsignal(sig) for sig in StopRequest.SIGNALS}
    stop = StopRequest()
    stop.install(signal.SIGUSR1)
    try:
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
        stop.install(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed() and stop.signal_name == "SIGTERM"
    finally:
        stop.uninstall()
    assert {sig: signal.getsignal(sig) for sig in StopRequest.SIGNALS} == before
