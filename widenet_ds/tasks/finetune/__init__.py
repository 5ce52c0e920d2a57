"""What every finetuning task shares: the settings, the results of a seed and of a run, one seed as a `Task`
(`task.py`) over what it finetunes on (the `Finetuning` protocol), the recipes, the token features, distributed
prediction, the finetuned model's weights and the training order of its examples."""
