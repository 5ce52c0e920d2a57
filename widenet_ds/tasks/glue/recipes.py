"""The finetuning recipe of each GLUE dataset (tasks/finetune/recipe.py says where the numbers come from)."""

from __future__ import annotations

from widenet_ds.tasks.finetune.recipe import FinetuneRecipe, albert_recipe, table7_recipe

GLUE_RECIPES: dict[str, FinetuneRecipe] = {  # by the dataset's name (GlueDataset.name)
    "CoLA": albert_recipe(5336, 320, 16, 1e-5, 0.0),
    "STS-B": albert_recipe(3598, 214, 16, 2e-5, 0.0),
    "SST-2": table7_recipe(5234, 314, 128, 4e-5, 1.2, 0.01, 0.0, 512),
    "MNLI": table7_recipe(10000, 1000, 128, 3e-5, 1.2, 0.01, 0.0, 512),
    "QNLI": albert_recipe(33112, 1986, 32, 1e-5, 0.0),
    "QQP": albert_recipe(14000, 1000, 128, 5e-5, 0.1),
    "RTE": albert_recipe(800, 200, 32, 3e-5, 0.1),
    "MRPC": albert_recipe(800, 200, 32, 2e-5, 0.0),
    "WNLI": albert_recipe(2000, 250, 16, 2e-5, 0.1),
}
