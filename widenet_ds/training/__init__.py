"""Training: the one loop (plan -> build -> resume -> steps -> save or stop) and its planner, the task protocol they
drive (the tasks themselves: widenet_ds/tasks/), the base of the run configurations and their command lines, metrics,
logging and preemption."""
