"""`widenet-ds launch --preflight [launch options] TASK -- OPTIONS`: the cluster checked for a job before it runs, by
the job's own launch with the preflight's ranks in its place.

Everything a real launch checks first is checked the same way (the launch options, the hostfile with its hosts
resolved, the rendezvous port, the task's options: launch/task_options.py, the ranks against the job's layout and
batch: launch/job_checks.py), then the same runner starts
`python -m widenet_ds.launch.preflight_rank TASK OPTIONS` on the job's nodes with the job's ranks per node and
environment (DeepSpeed's pdsh runner over a hostfile, or its local launcher on one machine; under Slurm the batch
script's srun starts the same module: `PREFLIGHT=1 sbatch slurm/train.sbatch ...`). The ranks run the checks and
rank 0 prints one table (launch/preflight_rank.py). The exit status: 0 when every check passed, 2 when one failed
(the table says which and on which node), anything else a rank's own failure, as for a run. Imports neither torch
nor DeepSpeed: the launch of the checks is as light as the job's.
"""

from __future__ import annotations

from widenet_ds.errors import LaunchError
from widenet_ds.launch.job_checks import check_job
from widenet_ds.launch.launcher import deepspeed_runner, plan_launch, run
from widenet_ds.launch.options import PROG, parse_launch_args, this_machine
from widenet_ds.launch.task_options import check_task_options, with_saved_settings

CHECKED_TASKS = ("pretrain",)  # launch/preflight_rank.py's


def cli(argv: list[str]) -> int:
    options = parse_launch_args(argv)
    if options.run_config is not None:
        options = with_saved_settings(options)
    if options.task not in CHECKED_TASKS:
        raise LaunchError(f"--preflight checks {', '.join(CHECKED_TASKS)} jobs; a {options.task} run's model, data and "
                          f"steps depend on its dataset and checkpoint, which its start-up checks (run it on a few "
                          f"ranks first)")
    plan = plan_launch(options, this_machine(), runner=deepspeed_runner())
    check_job(check_task_options(options), plan.world_size)  # as the job's launch refuses it, before any rank starts
    print(f"{PROG} --preflight: checking the cluster for this {options.task} job with its ranks (a few minutes; the "
          f"job is not started and its run folder not written)", flush=True)
    return run(plan)
