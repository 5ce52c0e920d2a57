"""ParaFormer schedules in the real training loops: the prefix schedule's steps follow the authors' phases,
a run stopped between batches resumes with identical losses (pretraining and image classification), the
staged schedule adds branches at its thresholds, and set-ups that would move resting branches are refused
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import ConfigError

from tests.support.launching import REPO
from tests.support.pretrain_support import (BOOKS, events, prepare_data, train_in_process, train_losses,
                                            write_ds_config, write_model_config)


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_data):
    return prepare_data(tmp_path_factory.mktemp("paraformer") / "seq64", [shared_data / BOOKS[0]])


def pretrain_args(data: Path, tmp_path: Path, out: str, *extra: str) -> list[str]:
    # WideNet x ParaFormer on the text body: 2 branches of 2 pre-LN blocks over the shared attention and MoE.
    model = write_model_config(tmp_path / "model.json", "widenet-tiny-e4", norm_position="pre", num_branches=2)
    ds = write_ds_config(tmp_path / "ds.json", zero_optimization={"stage": 0})
    return ["--model-config", str(model), "--deepspeed_config", str(ds), "--data", str(data),
            "--output-dir", str(tmp_path / out), "--log-interval", "1", "--eval-interval", "0",
            "--no-progress-bar", "--no-tensorboard", *extra]


@pytest.mark.slow  # trains in this process (20-140 s of CPU)
def test_prefix_pretraining_follows_the_phases_and_resumes_exactly(data, tmp_path, dist):
    schedule = ["--branch-schedule", "prefix", "--prefix-cycle-batches", "2"]
    assert train_in_process("pretrain", (pretrain_args(data, tmp_path, "full", *schedule, "--max-steps", "12"))) is not None
    # 2 batches of prefixes (1, 2), then 2 joint batches, repeated
    active = train_losses(tmp_path / "full", "branches/active")
    assert [active[s] for s in range(1, 13)] == [1, 2, 1, 2, 2, 2, 1, 2, 1, 2, 2, 2]
    # stopped after 5 steps (a batch boundary), then resumed
    assert train_in_process("pretrain", (pretrain_args(data, tmp_path, "part", *schedule, "--max-steps", "5"))) is not None
    assert train_in_process("pretrain", (pretrain_args(data, tmp_path, "part", *schedule, "--max-steps", "12",
                                                          "--resume"))) is not None
    full, part = train_losses(tmp_path / "full"), train_losses(tmp_path / "part")
    assert sorted(part) == list(range(1, 13))
    assert part == full  # exact: same batches, same prefixes, same optimizer state and RNG after the resume
    assert len(set(full.values())) == 12


@pytest.mark.slow  # trains in this process (20-140 s of CPU)
def test_a_run_length_inside_a_prefix_batch_is_rounded_up(data, tmp_path, dist):
    argv = pretrain_args(data, tmp_path, "run", "--branch-schedule", "prefix", "--prefix-cycle-batches", "2",
                         "--max-steps", "3")
    assert train_in_process("pretrain", (argv)) is not None
    assert max(train_losses(tmp_path / "run")) == 4  # the second batch's two prefix steps belong together
    assert any("the run ends at step 4" in e for e in events(tmp_path / "run"))


@pytest.mark.slow  # trains in this process (20-140 s of CPU)
def test_staged_pretraining_adds_the_second_branch_and_reports_mlm_loss_per_branch_count(data, tmp_path, dist):
    argv = pretrain_args(data, tmp_path, "run", "--branch-schedule", "staged", "--stage-steps", "3", "--max-steps", "5",
                         "--eval-interval", "5", "--eval-batches", "2")
    assert train_in_process("pretrain", (argv)) is not None
    active = train_losses(tmp_path / "run", "branches/active")
    assert [active[s] for s in range(1, 6)] == [1, 1, 1, 2, 2]
    # the compression curve on the held-out split: the first k branches, no retraining
    per_k = [train_losses(tmp_path / "run", f"valid_branches_{k}/mlm_loss")[5] for k in (1, 2)]
    assert train_losses(tmp_path / "run", "valid/mlm_loss")[5] == pytest.approx(per_k[1])  # k = 2: the full model
    assert per_k[0] != per_k[1]


@pytest.mark.slow  # trains in this process (20-140 s of CPU)
def test_pretraining_continues_from_an_expanded_folder(data, tmp_path, dist):
    # 2 branches pretrained, exported, expanded to 3. The first step of the new phase runs at the warm-up's
    # lr 0, so its held-out MLM loss with the first 2 branches is the old run's last one.
    short_eval = ["--eval-batches", "2"]
    assert train_in_process("pretrain", (pretrain_args(data, tmp_path, "two", "--max-steps", "4",
                                                          "--eval-interval", "4", *short_eval))) is not None
    assert widenet_ds(["convert", "to-folder", str(tmp_path / "two"), str(tmp_path / "two-folder")]) == 0
    three = tmp_path / "three-folder"
    assert widenet_ds(["branches", "expand", str(tmp_path / "two-folder"), str(three), "--branches", "3"]) == 0
    argv = pretrain_args(data, tmp_path, "three", "--init-from", str(three), "--max-steps", "1",
                         "--eval-interval", "1", *short_eval)
    argv[argv.index("--model-config") + 1] = str(three)  # the folder's own (expanded) model config
    assert train_in_process("pretrain", (argv)) is not None
    old = train_losses(tmp_path / "two", "valid/mlm_loss")[4]
    assert train_losses(tmp_path / "three", "valid_branches_2/mlm_loss")[1] == pytest.approx(old, abs=1e-5)
    assert any(e.startswith("loaded ") and str(three) in e for e in events(tmp_path / "three"))


def test_zero1_with_a_prefix_schedule_is_refused_before_anything_is_written(data, tmp_path, dist):
    argv = pretrain_args(data, tmp_path, "run", "--branch-schedule", "prefix", "--max-steps", "2")
    write_ds_config(tmp_path / "ds.json", zero_optimization={"stage": 1})
    argv[argv.index("--deepspeed_config") + 1] = str(write_ds_config(tmp_path / "ds1.json",
                                                                     zero_optimization={"stage": 1}))
    with pytest.raises(ConfigError, match="zero_optimization.stage is 1: set it to 0"):
        train_in_process("pretrain", (argv))
    assert not (tmp_path / "run").exists()


def classify_args(tmp_path: Path, out: str, *extra: str) -> list[str]:
    config = json.loads((REPO / "ds_configs" / "paraformer_cpu_small.json").read_text())
    config["scheduler"]["params"].update(total_num_steps=60, warmup_num_steps=6)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(config))
    return ["--model-config", "paraformer-tiny-3x4", "--set", "image_size=8", "--set", "patch_size=2",
            "--dataset", "digits", "--deepspeed_config", str(ds), "--output-dir", str(tmp_path / out),
            "--log-interval", "1", "--eval-interval", "0", "--workers", "0", "--randaugment", "1,10",
            "--no-progress-bar", "--no-tensorboard", "--branch-schedule", "prefix", "--prefix-cycle-batches", "1",
            *extra]


@pytest.mark.slow  # trains in this process (20-140 s of CPU)
def test_prefix_image_classification_resumes_exactly_and_reports_accuracy_per_branch_count(tmp_path, dist):
    assert train_in_process("classify", (classify_args(tmp_path, "full", "--max-steps", "12"))) is not None
    active = train_losses(tmp_path / "full", "branches/active")
    assert [active[s] for s in range(1, 13)] == [1, 2, 3, 3, 1, 2, 3, 3, 1, 2, 3, 3]
    assert train_in_process("classify", (classify_args(tmp_path, "part", "--max-steps", "4"))) is not None
    assert train_in_process("classify", (classify_args(tmp_path, "part", "--max-steps", "12", "--resume"))) is not None
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "full")
    results = json.loads((tmp_path / "full" / "results.json").read_text())
    by_branches = results["accuracy_by_branches"]
    assert sorted(by_branches) == ["1", "2", "3"] and results["branch_schedule"] == "prefix"
    assert by_branches["3"] == pytest.approx(results["test/accuracy"])  # all branches = the full model
    assert all(0.0 <= a <= 1.0 for a in by_branches.values())
