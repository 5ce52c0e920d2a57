"""Running a training task, above the tasks (widenet_ds/tasks/): the checks and start-up of a rank, the process
group, the folder's lock (`run_task.py`), what trains each task (`trainers.py`) and finetuning's sweep over seeds
(`sweep.py`)."""
