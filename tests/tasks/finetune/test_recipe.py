"""The finetuning recipes (widenet_ds/tasks/finetune/recipe.py, the rows in tasks/glue/recipes.py and
tasks/squad/recipes.py): the paper's Table 7 where it gives them, one for every dataset a model is finetuned on, and
how a DeepSpeed JSON differs from one."""

from __future__ import annotations

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe
from widenet_ds.tasks.glue.datasets import GLUE_DATASETS
from widenet_ds.tasks.glue.recipes import GLUE_RECIPES
from widenet_ds.tasks.squad.recipes import SQUAD_RECIPES


def test_recipes_table7_and_their_differences_from_a_deepspeed_json():
    assert GLUE_RECIPES["MNLI"].source == "widenet-table7"
    assert (GLUE_RECIPES["SST-2"].steps, GLUE_RECIPES["SST-2"].batch_size, GLUE_RECIPES["SST-2"].learning_rate) == \
        (5234, 128, 4e-5)
    v2 = SQUAD_RECIPES["2.0"]
    assert (v2.capacity_factor, v2.balance_weight, v2.dropout, v2.max_seq_length) == (1.2, 0.01, 0.0, 512)
    v1 = SQUAD_RECIPES["1.1"]
    assert (v1.capacity_factor, v1.balance_weight, v1.dropout, v1.max_seq_length) == (2.0, 0.0, 0.1, 384)
    rte = GLUE_RECIPES["RTE"]  # 800 steps, warmup 200, batch 32, lr 3e-5
    assert rte.differences(batch_size=32, learning_rate=3e-5, warmup_steps=200, steps=800) == []
    assert rte.differences(batch_size=128, learning_rate=3e-5, warmup_steps=None, steps=800) == [
        "batch size 32 in the recipe, 128 in the DeepSpeed JSON", "warmup steps 200 in the recipe, not set in the "
        "DeepSpeed JSON"]


def test_every_dataset_a_model_is_finetuned_on_has_a_recipe():
    """AX, the diagnostic set, is predicted by the MNLI model: no recipe of its own."""
    assert set(GLUE_RECIPES) == {d.name for d in GLUE_DATASETS.values() if d.eval_splits}
    assert set(SQUAD_RECIPES) == {"1.1", "2.0"}


@pytest.mark.parametrize("change, message", [
    ({"steps": 0}, "steps must be positive"), ({"warmup_steps": 11}, r"warmup_steps must be in \[0, steps=10\]"),
    ({"learning_rate": 0.0}, "learning_rate must be positive"), ({"balance_weight": -1.0}, "balance_weight must be >= 0"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\)")])
def test_a_recipe_that_cannot_work_is_refused_when_written(change, message):
    fields = dict(steps=10, warmup_steps=1, batch_size=8, learning_rate=1e-4, capacity_factor=1.2, balance_weight=0.01,
                  dropout=0.0, classifier_dropout=0.1, max_seq_length=64, source="test")
    FinetuneRecipe(**fields)
    with pytest.raises(ConfigError, match=message):
        FinetuneRecipe(**{**fields, **change})
