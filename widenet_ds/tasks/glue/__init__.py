"""Finetuning on the GLUE datasets: their files, labels and metrics (`datasets.py`, `metrics.py`: also
`widenet-ds glue-eval`), the recipes, the settings, and the `Finetuning` of one dataset."""
