"""The default bounds of a collective's wait (`--init-timeout`, `--train-timeout`), as plain numbers: a run
configuration holds them without importing torch (distributed/collective_timeouts.py applies them)."""

# The longest healthy waits measured (bench/bench_collective_waits.py, 2 CPU ranks on a loaded 2-core machine):
# 6.0 s at start-up and 6.6 s in training (widenet-base-e8, 643 MB checkpoints), and 362 s for the first JIT build
# of DeepSpeed's CPU op, which ranks of a node that builds it later wait for in the rendezvous.
INIT_TIMEOUT_S = 900.0
TRAIN_TIMEOUT_S = 300.0
MIN_TIMEOUT_S = 10.0  # a bound below the longest healthy wait would end healthy runs (and the store's own 10 s)
