# Sourced by slurm/*.sbatch. `run_preemptible CMD...` runs one srun step so that a preemption or the
# approaching time limit ends in a checkpoint and a requeue instead of lost work:
#
#   time limit        `#SBATCH --signal=B:USR1@300` signals this batch shell 5 min before the end
#   by hand           `scancel --batch --signal=USR1 <job>` (or TERM): checkpoint, requeue
#   stop for good     `scancel --signal=TERM <job>` (tasks only): checkpoint, job ends; resubmit later
#   preemption        Slurm sends TERM to every process; with PreemptMode=REQUEUE it requeues itself
#   a node fails      Slurm declares it DOWN (SlurmdTimeout), ends the job and requeues it (--requeue)
#
# On USR1/TERM the trap asks every task to checkpoint; the tasks save the same step and exit 0; the
# job then requeues itself (`scontrol requeue`: needs `#SBATCH --requeue`), keeps its job id and
# output folder, and its next run starts with `--resume`, from the latest checkpoint. When Slurm has
# requeued the job itself (a failed node, a preemption), the script says so and leaves it at that.
# The last line of a run always says what happens to the job next.

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
    if _requeued_by_slurm; then
        _accept_fewer_nodes
        echo "run_preemptible: Slurm requeued job $SLURM_JOB_ID$(_lost_nodes) (step exit $rc): its next run" \
             "resumes from the last checkpoint in $OUTPUT_DIR on the nodes Slurm gives it (fewer with a node" \
             "range, --nodes=MIN-MAX); nothing to do, \`squeue -j $SLURM_JOB_ID\` shows it"
        return 0
    fi
    if [ -z "$caught" ] && [ "$rc" -ne 0 ]; then
        echo "run_preemptible: the step failed (exit $rc); job $SLURM_JOB_ID ends without a requeue. The ranks'" \
             "lines above say why; fix that and submit again with OUTPUT_DIR=$OUTPUT_DIR (it resumes from its" \
             "last checkpoint)" >&2
        return "$rc"
    fi
    if [ -z "$caught" ]; then
        return 0
    fi
    if [ "$rc" -ne 0 ]; then
        echo "run_preemptible: the step failed (exit $rc) after SIG$caught, and Slurm is not requeueing job" \
             "$SLURM_JOB_ID: it ends. Submit again with OUTPUT_DIR=$OUTPUT_DIR to resume from its last checkpoint" >&2
        return "$rc"
    fi
    echo "run_preemptible: step checkpointed after SIG$caught; requeueing job $SLURM_JOB_ID"
    # On success this ends the script: Slurm stops the batch step and queues the job again.
    if scontrol requeue "$SLURM_JOB_ID" || _requeued_by_slurm; then  # (a preemption: Slurm requeues it itself)
        _accept_fewer_nodes
        return 0
    fi
    echo "run_preemptible: 'scontrol requeue' refused; submit with --requeue (and JobRequeue=1 or" \
         "a cluster that allows requeue), or resubmit the same OUTPUT_DIR by hand: it resumes" >&2
    return 1
}

_checkpoint_step() {
    # srun relays USR1 to its tasks but answers TERM by killing the step, so the tasks always get
    # USR1 (the entrypoints treat USR1 and TERM alike: checkpoint, exit 0).
    echo "run_preemptible: SIG$1 received, asking the tasks of job $SLURM_JOB_ID to checkpoint"
    kill -s USR1 "$_STEP_PID" 2>/dev/null || true
}

_requeued_by_slurm() {
    # Slurm counts a requeue (its own or ours) in the job's Restarts as it makes it, while this run still ends.
    local restarts
    restarts=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o ' Restarts=[0-9]*' | cut -d= -f2)
    [ -n "$restarts" ] && [ "$restarts" -gt "${SLURM_RESTART_COUNT:-0}" ]
}

_lost_nodes() {
    # " after node2 failed (down*)" for the job's nodes Slurm holds down or not responding ("*"), or nothing.
    local lost
    lost=$(sinfo -h -N -n "$SLURM_JOB_NODELIST" -o "%N %T" 2>/dev/null \
           | awk '$2 ~ /down|fail|\*/ {print $1 " (" $2 ")"}' | sort -u | paste -sd, -)
    [ -z "$lost" ] || echo " after $lost failed"
}

_accept_fewer_nodes() {
    # A requeued job keeps the task count of its last start (Slurm sets it from the nodes it got), which would
    # hold it until as many nodes are free again: one node's tasks let a node range start it on fewer.
    # Only while the job is not yet pending again; a refusal leaves the job as Slurm requeued it.
    [ -z "${SLURM_NTASKS_PER_NODE:-}" ] && return 0
    scontrol update JobId="$SLURM_JOB_ID" NumTasks="$SLURM_NTASKS_PER_NODE" 2>/dev/null || true
}
