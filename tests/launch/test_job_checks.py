"""What `widenet-ds launch` checks of the job before it starts anything (launch/job_checks.py): the layout on the
ranks it starts, with the options that fix it, the DeepSpeed JSON's batch there, the model read where the settings
name it readably, and a finished run's results said in place of a launch. Real runs' refusals and a finished run's
line through `widenet-ds launch`: tests/integration/test_bad_inputs.py."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.launching import REPO
from widenet_ds.errors import ConfigError, LaunchError
from widenet_ds.launch.job_checks import check_job, complete_line, model_named
from widenet_ds.model.config import ModelConfig
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults, SeedResults
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.training.run_config import LATEST
from widenet_ds.vision.config import VisionConfig

CPU = REPO / "ds_configs/cpu_small.json"  # 16 samples per step, micro batch 8
VISION = REPO / "ds_configs/vision_cpu_small.json"


def pretrain(tmp_path, **settings) -> PretrainConfig:
    return PretrainConfig(**{"model_config": "widenet-tiny-e4", "deepspeed_config": CPU, "data": tmp_path / "data",
                             "output_dir": tmp_path / "run", "max_steps": 4, **settings})


def test_an_ep_size_the_ranks_cannot_form_is_refused_with_the_option_that_fits(tmp_path):
    with pytest.raises(LaunchError, match=r"^the pretrain run on 1 rank: --ep-size 2 does not divide the 1 rank\(s\); "
                                          r".* To run on these ranks, add `--ep-size 1` after `--`\.$"):
        check_job(pretrain(tmp_path, ep_size=2), 1)
    # the largest that fits: 4 experts on 6 ranks take ep 2
    with pytest.raises(LaunchError, match=r"add `--ep-size 2` after `--`"):
        check_job(pretrain(tmp_path, ep_size=4), 6)
    check_job(pretrain(tmp_path, ep_size=2), 2)
    check_job(pretrain(tmp_path, ep_size=2), None)  # the rank count is not known here: the ranks check it


def test_branch_groups_and_their_fix(tmp_path):
    cfg = ClassifyConfig(model_config="paraformer-tiny-3x4", dataset="digits", deepspeed_config=VISION,
                         output_dir=tmp_path / "run", max_steps=2, branch_parallel=2)
    with pytest.raises(LaunchError, match=r"on 3 ranks: --branch-parallel 2: it does not divide the 3 rank\(s\).*"
                                          r"add `--branch-parallel 1` after `--`"):
        check_job(cfg, 3)
    check_job(cfg, 4)


def test_a_resume_is_told_that_its_checkpoint_is_laid_out_again(tmp_path):
    run = RunFolder(tmp_path / "run")
    (run.checkpoints / "step4").mkdir(parents=True)
    (run.checkpoints / "latest").write_text("step4")
    with pytest.raises(LaunchError, match=r"add `--ep-size 1` after `--` \(the resume re-lays its checkpoint out"):
        check_job(pretrain(tmp_path, ep_size=2, resume=LATEST), 1)


def test_the_json_batch_is_checked_on_the_data_parallel_ranks_where_the_json_is_here(tmp_path):
    with pytest.raises(LaunchError, match=r"on 3 ranks: DeepSpeed config: train_batch_size 16 is not a multiple of "
                                          r"train_micro_batch_size_per_gpu 8 x 3 data-parallel rank\(s\)"):
        check_job(pretrain(tmp_path), 3)
    check_job(pretrain(tmp_path, deepspeed_config=tmp_path / "on-the-nodes.json"), 3)  # not here: the ranks check it
    # a resume's batch is the checkpoint's to decide (its micro-batches' own message, in the ranks)
    run = RunFolder(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    (run.checkpoints / "latest").write_text("step4")
    check_job(pretrain(tmp_path, resume=LATEST), 3)


def test_the_model_is_read_where_the_settings_name_it_readably(tmp_path):
    assert model_named(pretrain(tmp_path, overrides=["moe.num_experts=8"])).moe.num_experts == 8
    json_file = tmp_path / "model.json"
    ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000).replace(moe={"num_experts": 6}).to_json(json_file)
    assert model_named(pretrain(tmp_path, model_config=str(json_file))).moe.num_experts == 6
    # a run folder's own model_config.json (a pretraining run as finetuning's --init-from)
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()
    ModelConfig.from_preset("widenet-tiny-e4").to_json(RunFolder(pretrained).model_config)
    squad = SquadConfig(version="1.1", data=str(tmp_path / "dev.json"), init_from=pretrained, deepspeed_config=CPU,
                        output_dir=tmp_path / "ft")
    assert model_named(squad).moe.num_experts == 4
    # an image task's presets are image models
    vision = ClassifyConfig(model_config="widenet-vit-digits", dataset="digits", deepspeed_config=VISION,
                            output_dir=tmp_path / "img")
    assert isinstance(model_named(vision), VisionConfig)
    # a checkpoint of another kind, or a file that is not here: the ranks read it
    assert model_named(pretrain(tmp_path, model_config=str(tmp_path / "elsewhere.json"))) is None
    elsewhere = SquadConfig(version="1.1", data="x", init_from=tmp_path / "portable", deepspeed_config=CPU, output_dir=tmp_path / "o")
    assert model_named(elsewhere) is None


def test_a_finished_run_resumed_is_said_complete_with_its_scores(tmp_path):
    cfg = pretrain(tmp_path, resume=LATEST)
    assert complete_line(cfg) is None  # nothing there
    run = cfg.folder
    run.path.mkdir()
    run.write_results(PretrainResults(4, {"valid/loss": 7.5, "valid/mlm_loss": 6.9}))
    line = complete_line(cfg)
    assert line == (f"the pretrain run in {run.path} is complete: step 4, held-out valid/loss 7.5000, valid/mlm_loss "
                    f"6.9000; its results: {run.results}. No rank started (to train again, choose a new --output-dir).")
    assert complete_line(pretrain(tmp_path, resume=LATEST, max_steps=8)) is None  # pretraining continues
    assert complete_line(pretrain(tmp_path)) is None  # not a resume

    image = ClassifyConfig(model_config="widenet-vit-digits", dataset="digits", deepspeed_config=VISION,
                           output_dir=tmp_path / "img", max_steps=20, resume=LATEST)
    image.folder.path.mkdir()
    image.folder.write_results(ClassifyResults(20, "digits", "widenet-vit-digits", 1, 1, 9, {"test/accuracy": 0.5}))
    assert "is complete: step 20, test/accuracy 0.5000;" in complete_line(image)


def test_a_finished_finetuning_run_says_its_medians_on_the_tasks_scale(tmp_path):
    cfg = SquadConfig(version="1.1", data=str(tmp_path / "dev.json"), model_config="widenet-tiny-e4", deepspeed_config=CPU,
                      output_dir=tmp_path / "ft", resume=LATEST)
    cfg.folder.path.mkdir()
    scores = {"dev": {"exact_match": 3.2, "f1": 7.25}}
    cfg.folder.write_results(FinetuneResults("squad", "preset:widenet-tiny-e4", 100, 1, scores,
                                             [SeedResults(1234, scores)], baseline={"dev": {"exact_match": 0.0,
                                                                                            "f1": 1.5}}))
    assert "is complete: 1 seed(s) of 100 steps, median dev exact_match 3.2000%, f1 7.2500% (trivial baseline: dev " \
           "exact_match 0.0000%, f1 1.5000%)" in complete_line(cfg)
    assert complete_line(SquadConfig(**{**vars(cfg), "seeds": 2})) is None  # another sweep: the ranks train it
    with pytest.raises(ConfigError, match=re.escape("--max-steps 50 cannot be applied to it")):
        complete_line(SquadConfig(**{**vars(cfg), "max_steps": 50}))
    assert json.loads(cfg.folder.results.read_text())["steps"] == 100
