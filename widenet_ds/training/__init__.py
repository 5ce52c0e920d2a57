"""Training: pretraining and finetuning loops and what they share (run-config flags, logging, preemption)."""
