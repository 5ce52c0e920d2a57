"""The task's options of a launch: checked (syntax and values) before any rank starts, given by `launch_config(cfg)`
for Python callers, and by `--config run_config.json` to run a saved configuration again. The launch plan:
tests/launch/test_launcher.py; real launches: tests/integration/."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.support.launching import REPO
from widenet_ds.errors import LaunchError
from widenet_ds.launch import launcher
from widenet_ds.launch.launcher import LaunchOptions
from widenet_ds.launch.task_options import cpu_advice
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.training.command_line import parse

DS = REPO / "ds_configs/cpu_small.json"


@pytest.fixture
def launched(monkeypatch):
    """The options a launch starts the ranks with, checked as it checks them; no rank started."""
    seen: list[LaunchOptions] = []
    # its plan: the options, on the ranks they ask for
    monkeypatch.setattr(launcher, "plan_launch", lambda options, machine, **_: SimpleNamespace(
        options=options, world_size=options.ranks_per_node))
    monkeypatch.setattr(launcher, "run", lambda plan: seen.append(plan.options) or 0)
    return seen


def test_a_configuration_is_launched_as_its_command_line(tmp_path, launched):
    cfg = PretrainConfig(model_config="widenet-tiny-e4", deepspeed_config=tmp_path / "on-the-nodes.json",
                         data=tmp_path / "data", output_dir=tmp_path / "run", max_steps=3, overrides=["moe.top_k=1"])
    assert launcher.launch_config(cfg, ranks_per_node=2) == 0
    (options,) = launched
    assert (options.task, options.ranks_per_node, options.train_args) == ("pretrain", 2, tuple(cfg.to_argv()))


def test_values_are_refused_before_any_rank_starts(launched):
    with pytest.raises(LaunchError, match=r"the glue options after `--`: 2 problems with the glue settings:(.|\n)*"
                                          r"--log-interval must be positive(.|\n)*--seeds must be positive"):
        launcher.cli(["glue", "--", "--task", "sst2", "--data", "hf", "--deepspeed-config", "x.json",
                        "--output-dir", "o", "--model-config", "widenet-tiny-e4", "--seeds", "0", "--log-interval",
                        "0"])
    with pytest.raises(LaunchError, match=r"the glue options after `--`: the following arguments are required"):
        launcher.cli(["glue", "--", "--data", "hf"])
    assert launched == []


def test_a_saved_configuration_is_launched_again(tmp_path, launched):
    cfg = GlueConfig(glue_task="sst2", data="hf", deepspeed_config=DS, output_dir=tmp_path / "run", seeds=3,
                     model_config="widenet-tiny-e4", overrides=["hidden_dropout=0.0"])
    run = tmp_path / "run"
    run.mkdir()
    # as the trainer writes it: the settings, the task's name and what the DeepSpeed JSON held (format version 2),
    # and as earlier versions wrote it (no version entry)
    record = {**cfg.record(), "deepspeed_settings": {"train_batch_size": 8}}
    for written in (json.dumps({"format_version": 2, **record}), json.dumps(record)):
        (run / "run_config.json").write_text(written)
        for given in (run, run / "run_config.json"):
            assert launcher.cli(["glue", "--num-ranks", "1", "--config", str(given), "--", "--resume"]) == 0
            options = launched.pop()
            # one command line, each setting once, the options after `--` applied
            assert options.train_args == tuple(replace(cfg, resume="latest").to_argv()) and options.run_config is None
    assert GlueConfig.from_record(cfg.record()) == cfg
    with pytest.raises(LaunchError, match=r"holds the settings of a glue run; launch `glue`"):
        launcher.cli(["squad", "--config", str(run)])
    with pytest.raises(LaunchError, match=r"--config .*nowhere: cannot read the run's settings"):
        launcher.cli(["glue", "--config", str(tmp_path / "nowhere")])


def saved_run(root, record_paths: dict[str, str], checkpoint: str | None = "step2"):
    """A run folder root/runs/x as an earlier version wrote it: its paths as typed, relative to `root`."""
    run = root / "runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    if checkpoint:
        (run / "checkpoints" / "latest").write_text(checkpoint)
    cfg = {"model_config": "widenet-tiny-e4", **record_paths}
    (run / "run_config.json").write_text(json.dumps({"task": "pretrain", **cfg, "max_steps": 3}))
    return run


def test_a_saved_run_continues_itself_from_any_directory(tmp_path, launched, monkeypatch):
    """Item 1: paths saved relative are read where the run was started (the run folder less its output_dir), the
    run's folder is where --config found it: from another directory, and for a copy beside the original."""
    root = tmp_path / "A"
    run = saved_run(root, {"output_dir": "runs/x", "data": "data/wiki", "deepspeed_config": "ds_configs/cpu.json"})
    (root / "data/wiki").mkdir(parents=True)  # what the run was started with, where it was started
    (root / "ds_configs").mkdir()
    (root / "ds_configs/cpu.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    def launched_config(given, *after: str):
        assert launcher.cli(["pretrain", "--num-ranks", "1", "--config", str(given), "--", *after]) == 0
        argv = launched.pop().train_args
        assert argv.count("--output-dir") == 1  # each setting once
        return parse(PretrainConfig, list(argv))

    for given, folder in ((run, run), (shutil.copytree(run, root / "runs/x2"), root / "runs/x2")):
        cfg = launched_config(given, "--resume", "--max-steps", "5")
        assert (cfg.output_dir, cfg.data, cfg.deepspeed_config) == (folder, root / "data/wiki",
                                                                     root / "ds_configs/cpu.json")
        assert (cfg.resume, cfg.max_steps) == ("latest", 5)
    # a record with absolute paths (this version's), moved: the run is where it was found
    moved = tmp_path / "B" / "run"
    shutil.copytree(run, moved)
    record = json.loads((moved / "run_config.json").read_text())
    record.update(output_dir=str(tmp_path / "gone/runs/x"), data=str(root / "data/wiki"))
    (moved / "run_config.json").write_text(json.dumps(record))
    cfg = launched_config(moved / "run_config.json", "--resume")
    assert (cfg.output_dir, cfg.data) == (moved, root / "data/wiki")


def test_a_resume_into_another_folder_than_the_saved_runs_is_refused(tmp_path, launched):
    """Item 1: --config RUN (with checkpoints) -- --resume --output-dir NEW (none) would start a new run in NEW."""
    run = saved_run(tmp_path, {"output_dir": "runs/x", "data": "d", "deepspeed_config": "ds.json"})
    new = tmp_path / "new"
    with pytest.raises(LaunchError, match=rf"--config {run} is a run with checkpoint step2, but --output-dir {new} "
                                          rf"holds nothing to resume: .*drop --output-dir.*--init-from {run} instead"):
        launcher.cli(["pretrain", "--config", str(run), "--", "--resume", "--output-dir", str(new)])
    # without --resume, or into a folder that has something to continue, it is the user's choice
    assert launcher.cli(["pretrain", "--num-ranks", "1", "--config", str(run), "--", "--output-dir", str(new)]) == 0
    assert launched.pop().train_args.count("--resume") == 0


def test_the_options_after_the_separator_apply_before_the_record_is_checked(tmp_path, launched):
    """A saved record without `data` (hand-edited) and --data after `--`: the run launches with it; `--set` adds
    to the saved overrides."""
    run = saved_run(tmp_path, {"output_dir": "runs/x", "deepspeed_config": "ds.json", "overrides": ["moe.top_k=1"]},
                    checkpoint=None)
    assert launcher.cli(["pretrain", "--num-ranks", "1", "--config", str(run), "--", "--data", "there", "--set",
                           "hidden_dropout=0.0"]) == 0
    argv = launched.pop().train_args
    assert argv[argv.index("--data") + 1] == "there"  # as typed: the ranks start in this directory
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == ["moe.top_k=1", "hidden_dropout=0.0"]


def test_a_finetuning_launch_without_cuda_says_once_what_fits_a_cpu_and_the_advice_is_taken(tmp_path):
    """Item 2: SQuAD with the paper's GPU recipe (bf16, batch 48) and the whole dev set, on a machine without CUDA:
    one line naming the small CPU JSON and --max-eval-examples; followed, the options parse and nothing more is
    advised. A small dev set (SST-2's) or a GPU machine: nothing."""
    squad = ["--version", "1.1", "--data", "hf", "--model-config", "widenet-tiny-e4", "--output-dir", str(tmp_path),
             "--deepspeed_config", str(REPO / "ds_configs/finetune_squad11.json")]
    advice = cpu_advice(parse(SquadConfig, squad), has_gpu=False)
    assert "finetune_squad11.json is a GPU recipe (bf16 is on, a batch of 48" in advice
    assert "the whole dev set is evaluated (SQuAD's: ~11,600 windows" in advice
    fixes = advice.split("pass after `--`: ")[1].split(" (README.md")[0].split()
    assert fixes == ["--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json"), "--allow-recipe-mismatch",
                     "--max-eval-examples", "500"]
    followed = parse(SquadConfig, squad + fixes)
    assert cpu_advice(followed, has_gpu=False) is None
    assert cpu_advice(parse(SquadConfig, squad), has_gpu=True) is None
    sst2 = ["--task", "sst2", "--data", "hf", "--model-config", "widenet-tiny-e4", "--output-dir", str(tmp_path),
            "--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json")]
    assert cpu_advice(parse(GlueConfig, sst2), has_gpu=False) is None
