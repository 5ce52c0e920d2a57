"""Branch-parallel ParaFormer training (`--branch-parallel 2`) on 2 real CPU ranks follows the 1-rank run of the same
model step by step: the same batches, the same losses (to float rounding), the same test accuracy and compression
curve; dense ParaFormer and WideNet x ParaFormer (dropless). A branch-parallel run continues on one rank and a
1-rank run on a branch group (`--resume`), and its checkpoint re-laid out to one rank and back keeps every
tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.golden_curves import ulps
from tests.support.launching import REPO, run_train
from tests.support.pretrain_support import events, train_in_process, train_losses
from tests.support.shape_free_states import assert_identical, relayout, shape_free_of, spec
from widenet_ds.checkpoint.shape_free import save_shape_free
from widenet_ds.commands.convert import cli as convert
from widenet_ds.fs.checksums import record_files

TRAIN_STEPS = 6
SAVE = 3  # the checkpoint the continuations start from
# Measured (docs/pretraining.md, "Resuming on another shape"): fp32 and the same micro-batches on both sides, only the
# branches' sums in another order.
BRANCH_PARALLEL_TOLERANCE_ULPS = 64
TRAIN_CASES = {
    # name -> model flags; no dropout: the ranks of a branch group draw the masks of other branch sets than
    # one rank does, which would make the two runs differ by design.
    "paraformer-3x4": ["--model-config", "paraformer-tiny-3x4"],
    # Shared attention + shared MoE, dropless (no per-rank capacity) and no balance loss: a rank's balance
    # loss covers its own branches' routing only (docs/paraformer.md).
    "widenet-paraformer-3x4": ["--model-config", "widenet-paraformer-tiny-3x4", "--set", "moe.dispatch=dropless",
                               "--set", "moe.noise=none", "--set", "moe.balance_loss_weight=0"],
}


def train_one_rank(argv: list[str]) -> None:
    """The 1-rank runs train in this process (the `dist` fixture's group, one torch thread as a launched rank has):
    a launched rank's start-up costs 6-8 s of CPU, and the 2-rank runs are the ones under the launcher here."""
    assert train_in_process("classify", argv) is not None


def train_args(case: str, out: Path, *extra: str) -> list[str]:
    return [*TRAIN_CASES[case], "--set", "image_size=8", "--set", "patch_size=2", "--set", "hidden_dropout=0",
            "--set", "attention_dropout=0", "--dataset", "digits", "--deepspeed-config",
            str(REPO / "ds_configs/paraformer_cpu_small.json"), "--output-dir", str(out), "--max-steps",
            str(TRAIN_STEPS), "--log-interval", "1", "--eval-interval", "0", "--workers", "0", "--seed", "3",
            "--no-progress-bar", "--no-tensorboard", *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dist):
    """case -> its 1-rank and its branch-parallel run folders, each run trained once (saving at step 3)."""
    runs = {}

    def get(case: str) -> tuple[Path, Path]:
        if case not in runs:
            root = tmp_path_factory.mktemp(case)
            saves = ("--save-interval", str(SAVE), "--keep-last", "2")
            train_one_rank(train_args(case, root / "one", *saves))
            run_train("classify", train_args(case, root / "two", "--branch-parallel", "2", *saves), num_ranks=2)
            runs[case] = (root / "one", root / "two")
        return runs[case]
    return get


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_branch_parallel_training_on_two_ranks_follows_the_one_rank_run(case, trained):
    one_run, two_run = trained(case)
    one, two = train_losses(one_run), train_losses(two_run)
    assert sorted(two) == list(range(1, TRAIN_STEPS + 1))
    # The same batches, the same weights after every step: only float sums in another order (3 branches
    # summed by one rank vs 2 + 1 summed by an all-reduce).
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6), (step, one, two)
    assert len(set(one.values())) == TRAIN_STEPS  # the model trained: the losses moved
    assert any("branch-parallel: groups of 2 ranks, this rank's branches [0, 1]" in e for e in events(two_run))
    one_results = json.loads((one_run / "results.json").read_text())
    two_results = json.loads((two_run / "results.json").read_text())
    assert two_results["test/accuracy"] == pytest.approx(one_results["test/accuracy"], abs=1e-6)
    for k in ("1", "2", "3"):  # the compression curve too: rank 1's branch joins only for k = 3
        assert two_results["accuracy_by_branches"][k] == pytest.approx(one_results["accuracy_by_branches"][k],
                                                                        abs=1e-6)


def distance(got: dict[int, float], want: dict[int, float]) -> float:
    return max(ulps(want[step], got[step]) for step in range(SAVE + 1, TRAIN_STEPS + 1))


@pytest.mark.multirank
@pytest.mark.slow
def test_a_branch_parallel_run_continues_on_one_rank_and_a_one_rank_run_on_a_branch_group(trained, tmp_path, dist):
    """--resume re-lays the branch group's checkpoint out for 1 rank, and a 1-rank run's for a group of 2 ranks:
    each continues its run within the tolerance; the uninterrupted run on the other shape and a restart from the
    weights (--init-from: a new AdamW, the schedule and the data from their start) are the measures."""
    one_run, two_run = trained("paraformer-3x4")
    one, two = train_losses(one_run), train_losses(two_run)
    tags = {run: run / "checkpoints" / f"step{SAVE}" for run in (one_run, two_run)}
    before = {run: record_files(tag) for run, tag in tags.items()}
    train_one_rank(train_args("paraformer-3x4", tmp_path / "to_one", "--resume", str(tags[two_run])))
    run_train("classify", train_args("paraformer-3x4", tmp_path / "to_two", "--resume", str(tags[one_run]),
                                     "--branch-parallel", "2"), num_ranks=2)
    train_one_rank(train_args("paraformer-3x4", tmp_path / "restart", "--init-from", str(tags[two_run]),
                              "--max-steps", str(TRAIN_STEPS - SAVE)))  # (the last --max-steps)
    assert {run: record_files(tag) for run, tag in tags.items()} == before  # the checkpoints read are untouched
    restarted = {step + SAVE: loss for step, loss in train_losses(tmp_path / "restart").items()}
    to_one, to_two = train_losses(tmp_path / "to_one"), train_losses(tmp_path / "to_two")
    measured = {"2 ranks branch-parallel 2 -> 1 rank": distance(to_one, two),
                "1 rank -> 2 ranks branch-parallel 2": distance(to_two, one),
                "uninterrupted on the other shape": distance(one, two), "--init-from": distance(restarted, two)}
    print(", ".join(f"{name} {value:.0f} ulps" for name, value in measured.items()))
    assert measured["2 ranks branch-parallel 2 -> 1 rank"] <= BRANCH_PARALLEL_TOLERANCE_ULPS, measured
    assert measured["1 rank -> 2 ranks branch-parallel 2"] <= BRANCH_PARALLEL_TOLERANCE_ULPS, measured
    assert measured["--init-from"] > 100 * BRANCH_PARALLEL_TOLERANCE_ULPS, measured
    said = [e for e in events(tmp_path / "to_one") if e.startswith("resumed from")]
    assert "on another shape (2 ranks, ep 1, ZeRO 0, branch-parallel 2 -> 1 rank, ep 1, ZeRO 0, branch-parallel 1)" \
        in said[0] and "continues step for step" in said[0], said
    assert any("branch-parallel: groups of 2 ranks, this rank's branches [0, 1]" in e for e in events(tmp_path / "to_two"))


@pytest.mark.multirank
@pytest.mark.slow
def test_a_branch_parallel_checkpoint_re_laid_out_to_one_rank_and_back_keeps_every_tensor(trained, tmp_path):
    """Every rank of a branch group holds every weight and its AdamW state (ZeRO 0, fp32; branch-parallel runs are
    fp32 only): 2 ranks in one group -> 1 rank -> a group of 2 again, by real engines, every tensor to the bit; and
    `convert reshard` for 1 rank carries the same state, the source untouched, the copy without branch groups."""
    tag = trained("paraformer-3x4")[1] / "checkpoints" / f"step{SAVE}"
    original = shape_free_of(tag)
    before = record_files(tag)
    assert convert(["reshard", str(tag), str(tmp_path / "resharded"), "--ep-size", "1", "--world-size", "1"]) == 0
    assert record_files(tag) == before
    resharded = tmp_path / "resharded" / f"step{SAVE}"
    marker = json.loads((resharded / "widenet_checkpoint.json").read_text())
    assert (marker["world_size"], marker["branch_parallel"]) == (1, 1)
    assert {k: marker["resharded_from"][k] for k in ("world_size", "branch_parallel")} == \
        {"world_size": 2, "branch_parallel": 2}
    assert_identical(shape_free_of(resharded), original)
    assert {k: original.scalars["source"][k] for k in ("world_size", "zero_stage", "precision")} == \
        {"world_size": 2, "zero_stage": 0, "precision": "fp32"}
    save_shape_free(original, tmp_path / "state")
    relayout(1, spec(tmp_path / "state", tmp_path / "one", 1, 0))
    on_one = shape_free_of(tmp_path / "one" / "checkpoints" / f"step{SAVE}")
    assert on_one.scalars["source"]["world_size"] == 1
    assert_identical(on_one, original)
    save_shape_free(on_one, tmp_path / "one_state")
    relayout(2, spec(tmp_path / "one_state", tmp_path / "back", 1, 0, branch_parallel=2))
    back = tmp_path / "back" / "checkpoints" / f"step{SAVE}"
    assert json.loads((back / "widenet_checkpoint.json").read_text())["branch_parallel"] == 2
    assert_identical(shape_free_of(back), original)
