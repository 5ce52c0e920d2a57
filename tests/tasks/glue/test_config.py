"""The GLUE settings (widenet_ds/tasks/glue/config.py): what they tell the tools outside the task (the scale of
their scores, the cost of a dev set on CPU cores), and the flag's list of datasets, taken from the datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.glue.datasets import GLUE_DATASETS
from widenet_ds.training.command_line import build_parser
from widenet_ds.training.run_config import InvalidConfig


def glue(tmp_path: Path, **fields) -> GlueConfig:
    return GlueConfig(**{"glue_task": "sst2", "data": "hf", "deepspeed_config": tmp_path / "ds.json",
                         "output_dir": tmp_path / "out", "model_config": "widenet-tiny-e4", **fields})


def test_scores_are_fractions(tmp_path):
    assert [GlueConfig.score_scale(metric) for metric in ("acc", "f1", "mcc", "corr")] == ["0-1"] * 4


@pytest.mark.parametrize("name, cost", [("mnli", "MNLI's: 19,647 pairs"), ("QQP", "QQP's: 40,430 pairs"),
                                        ("qnli", "QNLI's: 5,463 pairs"), ("sst2", None), ("rte", None)])
def test_the_big_dev_sets_say_their_cost_on_cpu_cores(tmp_path, name, cost):
    cfg = glue(tmp_path, glue_task=name)
    assert cfg.dev_set_cost() == cost and cfg.cpu_recipe_flags() == "--allow-recipe-mismatch"
    assert glue(tmp_path, glue_task=name, eval_only=True, init_from=tmp_path, model_config=None).cpu_recipe_flags() \
        is None  # scoring only: nothing trains


def test_an_unknown_dataset_is_a_problem_and_has_no_cost(tmp_path):
    with pytest.raises(InvalidConfig, match="--glue-task: unknown GLUE task 'sst3'") as refused:
        glue(tmp_path, glue_task="sst3")
    assert refused.value.config.dev_set_cost() is None


def test_the_flag_lists_every_dataset_a_model_is_finetuned_on():
    help_text = next(a.help for a in build_parser(GlueConfig)._actions if a.dest == "glue_task")
    listed = help_text.partition("(")[2].partition(")")[0].split()
    assert listed == [d.hf_name for d in GLUE_DATASETS.values() if d.eval_splits] and "ax" not in listed


def test_its_data_and_tokenizer_are_recorded_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = glue(tmp_path, data="glue/SST-2", tokenizer="vocab.txt").record()
    assert record["data"] == os.path.join(tmp_path, "glue/SST-2") and record["tokenizer"] == str(tmp_path / "vocab.txt")
    assert glue(tmp_path).record()["data"] == "hf"  # HF datasets: no path
