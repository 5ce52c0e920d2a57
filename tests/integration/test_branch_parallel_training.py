"""Branch-parallel ParaFormer training (`--branch-parallel 2`) on 2 real CPU ranks follows the 1-rank run of the same
model step by step: the same batches, the same losses (to float rounding), the same test accuracy and compression
curve; dense ParaFormer and WideNet x ParaFormer (dropless)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.launching import REPO, run_train
from tests.support.pretrain_support import events, train_losses

TRAIN_STEPS = 6
TRAIN_CASES = {
    # name -> model flags; no dropout: the ranks of a branch group draw the masks of other branch sets than
    # one rank does, which would make the two runs differ by design.
    "paraformer-3x4": ["--model-config", "paraformer-tiny-3x4"],
    # Shared attention + shared MoE, dropless (no per-rank capacity) and no balance loss: a rank's balance
    # loss covers its own branches' routing only (docs/paraformer.md).
    "widenet-paraformer-3x4": ["--model-config", "widenet-paraformer-tiny-3x4", "--set", "moe.dispatch=dropless",
                               "--set", "moe.noise=none", "--set", "moe.balance_loss_weight=0"],
}


def train_args(case: str, out: Path, *extra: str) -> list[str]:
    return [*TRAIN_CASES[case], "--set", "image_size=8", "--set", "patch_size=2", "--set", "hidden_dropout=0",
            "--set", "attention_dropout=0", "--dataset", "digits", "--deepspeed-config",
            str(REPO / "ds_configs/paraformer_cpu_small.json"), "--output-dir", str(out), "--max-steps",
            str(TRAIN_STEPS), "--log-interval", "1", "--eval-interval", "0", "--workers", "0", "--seed", "3",
            "--no-progress-bar", "--no-tensorboard", *extra]


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_branch_parallel_training_on_two_ranks_follows_the_one_rank_run(case, tmp_path):
    run_train("classify", train_args(case, tmp_path / "one"), num_ranks=1)
    run_train("classify", train_args(case, tmp_path / "two", "--branch-parallel", "2"), num_ranks=2)
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(two) == list(range(1, TRAIN_STEPS + 1))
    # The same batches, the same weights after every step: only float sums in another order (3 branches
    # summed by one rank vs 2 + 1 summed by an all-reduce).
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6), (step, one, two)
    assert len(set(one.values())) == TRAIN_STEPS  # the model trained: the losses moved
    assert any("branch-parallel: groups of 2 ranks, this rank's branches [0, 1]" in e for e in events(tmp_path / "two"))
    one_results = json.loads((tmp_path / "one" / "results.json").read_text())
    two_results = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two_results["test/accuracy"] == pytest.approx(one_results["test/accuracy"], abs=1e-6)
    for k in ("1", "2", "3"):  # the compression curve too: rank 1's branch joins only for k = 3
        assert two_results["accuracy_by_branches"][k] == pytest.approx(one_results["accuracy_by_branches"][k],
                                                                        abs=1e-6)
