"""The finetuning benchmarks as data: GLUE and SQuAD readers, features, decoding, recipes and official metrics.

Each GLUE dataset is a small registry entry (`glue.GLUE_DATASETS`: files, columns, labels, metric), each benchmark
a recipe (`recipes.py`); the finetuning loop is shared and never branches on a benchmark's name beyond looking the
entry up (training/benchmark.py).
"""
