# Sourced by slurm/*.sbatch. `run_preemptible CMD...` runs one srun step so that a preemption or the
# approaching time limit ends in a checkpoint and a requeue instead of lost work:
#
#   time limit        `#SBATCH --signal=B:USR1@300` signals this batch shell 5 min before the end
#   by hand           `scancel --batch --signal=USR1 <job>` (or TERM): checkpoint, requeue
#   stop for good     `scancel --signal=TERM <job>` (tasks only): checkpoint, job ends; resubmit later
#   preemption        Slurm sends TERM to every process; with PreemptMode=REQUEUE it requeues itself
#
# On USR1/TERM the trap asks every task to checkpoint; the tasks save the same step and exit 0; the
# job then requeues itself (`scontrol requeue`: needs `#SBATCH --requeue`), keeps its job id and
# output folder, and its next run starts with `--resume`, from the latest checkpoint.

run_preemptible() {
    local caught="" rc=0
    # bash runs a trap only between commands: the step runs in the background while we `wait`.
    trap 'caught=USR1; _checkpoint_step USR1' USR1
    trap 'caught=TERM; _checkpoint_step TERM' TERM
    "$@" &
    _STEP_PID=$!
    while true; do
        rc=0
        wait "$_STEP_PID" || rc=$?  # `|| rc=$?`: sbatch scripts may run under `set -e`
        # `wait` returns early (>128) when a trapped signal arrives; the step is still running.
        kill -0 "$_STEP_PID" 2>/dev/null || break
    done
    trap - USR1 TERM
    if [ -z "$caught" ]; then
        return "$rc"
    fi
    if [ "$rc" -ne 0 ]; then
        echo "run_preemptible: step failed (exit $rc) after SIG$caught; not requeueing" >&2
        return "$rc"
    fi
    echo "run_preemptible: step checkpointed after SIG$caught; requeueing job $SLURM_JOB_ID"
    # On success this ends the script: Slurm stops the batch step and queues the job again.
    scontrol requeue "$SLURM_JOB_ID" || {
        echo "run_preemptible: 'scontrol requeue' refused; submit with --requeue (and JobRequeue=1 or" \
             "a cluster that allows requeue), or resubmit the same OUTPUT_DIR by hand: it resumes" >&2
        return 1
    }
}

_checkpoint_step() {
    # srun relays USR1 to its tasks but answers TERM by killing the step, so the tasks always get
    # USR1 (the entrypoints treat USR1 and TERM alike: checkpoint, exit 0).
    echo "run_preemptible: SIG$1 received, asking the tasks of job $SLURM_JOB_ID to checkpoint"
    kill -s USR1 "$_STEP_PID" 2>/dev/null || true
}
