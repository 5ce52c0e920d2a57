# Sourced by slurm/*.sbatch. `run_preemptible CMD...` runs one srun step so that a preemption or the
# approaching time limit ends in a checkpoint and a requeue instead of lost work.
#
# Slurm signals this batch shell: USR1 shortly before the time limit (`#SBATCH --signal=B:USR1@T`),
# TERM on preemption, or whatever `scancel --batch --signal=USR1|TERM <job>` sends. The trap passes
# the signal to every task of the step; each task saves a checkpoint and exits 0; the job then
# requeues itself (`scontrol requeue`, needs `#SBATCH --requeue` and JobRequeue=1 or the flag) and
# its next run starts with `--resume`, from the latest checkpoint, under the same job id.

run_preemptible() {
    local caught="" rc=0
    # bash runs a trap only between commands: the step runs in the background and we `wait`.
    trap 'caught=USR1; _forward_to_step USR1' USR1
    trap 'caught=TERM; _forward_to_step TERM' TERM
    "$@" &
    _STEP_PID=$!
    while true; do
        wait "$_STEP_PID"
        rc=$?
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
    scontrol requeue "$SLURM_JOB_ID"
}

_forward_to_step() {
    echo "run_preemptible: SIG$1 received, forwarding to the tasks of job $SLURM_JOB_ID"
    kill -s "$1" "$_STEP_PID" 2>/dev/null || true
}
