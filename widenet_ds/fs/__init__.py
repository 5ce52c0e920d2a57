"""The file system, torch-free: all-or-nothing writers (`atomic.py`), file records and their checks (`checksums.py`),
free space (`disk_space.py`), one writer per run folder (`run_lock.py`) and output folders checked before a run
writes (`writable.py`)."""
