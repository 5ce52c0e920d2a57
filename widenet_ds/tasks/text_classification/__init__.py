"""Finetuning on your own labelled texts (the `text-classification` task: transformers' name of it): sentence and
sentence-pair classification or regression from CSV, TSV, JSON lines or Parquet files or a HF dataset. Its files and
their checks (`data.py`), its scores (`metrics.py`), the settings, and its `Finetuning` over the GLUE task's
features and predictions."""
