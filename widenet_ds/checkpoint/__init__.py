"""Checkpoints: training checkpoints (DeepSpeed tag folders with our completion marker), the portable
folder, reading DeepSpeed checkpoints without unpickling code, loading into a model (`load.load_pretrained`),
resharding to another ep_size, HF ALBERT conversion, and the `widenet-ds convert` CLI."""
