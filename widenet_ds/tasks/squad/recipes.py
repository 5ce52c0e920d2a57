"""The finetuning recipes of SQuAD v1.1 and v2.0: the WideNet paper's Table 7 (tasks/finetune/recipe.py)."""

from __future__ import annotations

from widenet_ds.tasks.finetune.recipe import FinetuneRecipe, table7_recipe

SQUAD_RECIPES: dict[str, FinetuneRecipe] = {  # by the version
    "1.1": table7_recipe(3649, 365, 48, 5e-5, 2.0, 0.0, 0.1, 384),
    "2.0": table7_recipe(8144, 814, 48, 3e-5, 1.2, 0.01, 0.0, 512),
}
