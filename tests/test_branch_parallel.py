"""Branch-parallel ParaFormer on 2 real CPU ranks (deepspeed launcher, gloo): each rank computes only its
branches and one all-reduce sums them. The logits, and after a backward every gradient a rank holds (its own
branches', the shared attention/MoE's after their all-reduce, the embeddings' and the head's), equal the
one-process model's; a rank holds no gradient for the other ranks' branches. Training with `--branch-parallel 2`
on 2 ranks follows the 1-rank run step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from launching import REPO, run_deepspeed
from branch_parallel_forward import CASES, build, run

SCRIPT = REPO / "tests" / "scripts" / "branch_parallel_forward.py"


def branch_parameter_names(model: torch.nn.Module, branch: int) -> set[str]:
    owned = {id(p) for module in model.encoder.branch_modules(branch) for p in module.parameters()}
    return {name for name, p in model.named_parameters() if id(p) in owned}


@pytest.fixture(scope="module")
def two_rank_outputs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("branch_parallel") / "bp"
    run_deepspeed(SCRIPT, [str(out)], num_ranks=2)
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_give_the_logits_and_gradients_of_one(two_rank_outputs, case):
    model = build(case)
    logits, loss, dropped = run(case, model)
    loss.backward()
    reference = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    num_branches = model.encoder.cfg.num_branches
    owned_by_rank = {0: [0, 1], 1: [2]} if num_branches == 3 else {0: [0], 1: [1]}
    for rank, own in owned_by_rank.items():
        saved = load_file(f"{two_rank_outputs}.{case}.rank{rank}.safetensors")
        assert saved["branches"].tolist() == own
        torch.testing.assert_close(saved["logits"], logits.detach(), atol=1e-5, rtol=0)
        torch.testing.assert_close(saved["loss"], loss.detach().reshape(1), atol=1e-5, rtol=0)
        others = set().union(*(branch_parameter_names(model, b) for b in range(num_branches) if b not in own))
        grads = {key.removeprefix("grad/"): value for key, value in saved.items() if key.startswith("grad/")}
        # this rank's branches and everything shared, nothing of the other ranks' branches
        assert set(grads) == set(reference) - others, sorted(set(grads) ^ (set(reference) - others))
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference[name], atol=1e-5, rtol=1e-4, msg=f"{case} rank {rank}: {name}")
        if dropped is not None:  # dropless: no per-rank capacity
            assert dropped.sum() == 0 and saved["dropped"].sum() == 0
    # each rank held branch parameters with a gradient (except a rank whose branches were all inactive)
    active = CASES[case][2] or num_branches
    for rank, own in owned_by_rank.items():
        saved = load_file(f"{two_rank_outputs}.{case}.rank{rank}.safetensors")
        mine = set().union(*(branch_parameter_names(model, b) for b in own if b < active))
        assert mine <= {key.removeprefix("grad/") for key in saved}
        assert bool(mine) == any(b < active for b in own)


# --- branch-parallel training (`--branch-parallel 2`): the same run as on one rank -----------------------------
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
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_branch_parallel_training_on_two_ranks_follows_the_one_rank_run(case, tmp_path):
    from launching import run_train
    from pretrain_support import events, train_losses

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
