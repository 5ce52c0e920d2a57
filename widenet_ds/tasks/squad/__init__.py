"""Finetuning on SQuAD v1.1 / v2.0: its JSON files (`data.py`), the windows of a context (`features.py`), the n-best
decoding (`postprocess.py`), the official scores (`metrics.py`: also `widenet-ds squad-eval`), the recipes, the
settings, and its `Finetuning`."""
