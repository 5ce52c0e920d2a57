"""Shape-free training states in tests: re-laying one out with real engines under the launcher
(tests/scripts/shape_free_relayout.py) and comparing two to the bit."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.launching import REPO, run_deepspeed
from widenet_ds.checkpoint.shape_free import ShapeFreeState, read_shape_free
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource

RELAYOUT = REPO / "tests/scripts/shape_free_relayout.py"
# A bf16 run continued on another shape: how far its masters may land from the uninterrupted run's, as a share of
# the continued steps' update (`weights_apart`). Measured and justified in tests/integration/test_resume_new_shape.py.
BF16_TOLERANCE = 0.02


def spec(state_folder: Path, out: Path, ep_size: int, stage: int, precision: str = "fp32",
         branch_parallel: int = 1) -> str:
    """One re-layout of the relayout script: the state of `state_folder` into a new engine, saved under `out`."""
    return f"{state_folder},{out},{ep_size},{stage},{precision},{branch_parallel}"


def relayout(ranks: int, *specs: str) -> None:
    """The re-layouts of `specs`, one after the other in one launch of `ranks` ranks."""
    run_deepspeed(RELAYOUT, ["relayout", *specs], num_ranks=ranks)


def shape_free_of(path: Path) -> ShapeFreeState:
    """The shape-free state of the training checkpoint at `path`, opened as `convert` opens it."""
    return read_shape_free(CheckpointSource.open(path, "source", purpose=CONVERT))


def masters(tag: Path) -> torch.Tensor:
    """Every fp32 master weight of the checkpoint tag, whole and in one vector (by name)."""
    state = shape_free_of(tag)
    return torch.cat([state.master[name].detach().reshape(-1) for name in sorted(state.master)])


def weights_apart(tag: Path, reference: Path, reference_start: Path) -> float:
    """How far the master weights of `tag` are from those of `reference`, as a share of how far the reference's
    run moved them since `reference_start`: |w - w_ref| / |w_ref - w_ref_start| (0: the same weights; about 1: as
    far as the continued steps moved them)."""
    want = masters(reference)
    return float((masters(tag) - want).norm() / (want - masters(reference_start)).norm())


def assert_identical(got: ShapeFreeState, want: ShapeFreeState) -> None:
    """Every master weight and optimizer state tensor to the bit, the same steps, hyper-parameters and schedule."""
    assert set(got.master) == set(want.master)
    assert set(got.optimizer) == set(want.optimizer) == {"exp_avg", "exp_avg_sq"}
    for name, tensor in want.master.items():
        assert torch.equal(got.master[name], tensor), name
        for what in want.optimizer:
            assert torch.equal(got.optimizer[what][name], want.optimizer[what][name]), (what, name)
    assert got.param_state == want.param_state and got.hyper == want.hyper
    for scalar in ("lr_scheduler", "global_steps", "global_samples", "skipped_steps"):
        assert got.scalars[scalar] == want.scalars[scalar], scalar
