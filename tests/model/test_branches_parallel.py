"""Branch-parallel ParaFormer on 2 real CPU ranks (deepspeed launcher, gloo): each rank computes only its
branches and one all-reduce sums them. The logits, and after a backward every gradient a rank holds (its own
branches', the shared attention/MoE's after their all-reduce, the embeddings' and the head's), equal the
one-process model's; a rank holds no gradient for the other ranks' branches. (Training with `--branch-parallel`:
tests/integration/test_branch_parallel_training.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launching import REPO, run_deepspeed
from tests.scripts.branch_parallel_forward import CASES, build, run

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
