"""MLM + sentence-order pretraining on a prepared data folder: its settings, results and task."""
