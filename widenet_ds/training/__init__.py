"""Training: the one trainer (plan -> build -> resume -> steps -> save or stop) and its tasks (pretraining,
finetuning as seeds x trainer, image classification), their run configurations and command lines, metrics,
logging and preemption."""
