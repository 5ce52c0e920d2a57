"""Training checkpoints: the marker that makes a tag complete, the tags of a run (`tags.py`), saving and resuming
(`manager.py`), the one route from a path to a checkpoint (`source.py`), reading DeepSpeed's files without
unpickling code (`deepspeed.py`), verifying them, the shape-free training state and resharding."""
