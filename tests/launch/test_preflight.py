"""`widenet-ds launch --preflight` (launch/preflight.py): the job's own launch with the preflight's ranks in place of
the trainer's, as light as the job's launch. Its refusals are rows of tests/integration/test_bad_inputs.py; the checks
on two local ranks: tests/launch/test_preflight_rank.py; across nodes (pdsh, sbatch): tests/integration/
test_two_nodes.py."""

from __future__ import annotations

import subprocess
import sys

from tests.support.launching import REPO, child_env
from widenet_ds.launch.launcher import plan_launch
from widenet_ds.launch.options import PREFLIGHT_MODULE, Machine, parse_launch_args

JOB = ["--model-config", "widenet-tiny-e4", "--ep-size", "2", "--deepspeed_config", "ds_configs/cpu_small_bf16.json",
       "--data", "data/wb128", "--output-dir", "runs/e4"]


def test_the_preflight_starts_its_ranks_where_and_as_the_job_would(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n")
    for launch in (["--num-ranks", "2"], ["--hostfile", str(hostfile), "--num-ranks", "2"]):
        job = parse_launch_args([*launch, "pretrain", "--", *JOB])
        preflight = parse_launch_args([*launch, "--preflight", "pretrain", "--", *JOB])
        assert preflight.preflight and not job.preflight
        job_plan, preflight_plan = (plan_launch(o, Machine(cores=2, has_gpu=False), environ={})
                                    for o in (job, preflight))
        at = job_plan.command.index("--module")
        # the same runner, ranks, nodes and environment; only the module differs (the ports are free ones)
        assert [a for a in preflight_plan.command[:at] if not a.isdigit()] == \
            [a for a in job_plan.command[:at] if not a.isdigit()]
        assert preflight_plan.command[at:] == ["--module", PREFLIGHT_MODULE, "pretrain", *JOB]
        assert job_plan.command[at + 1] == "widenet_ds.train"
        assert (preflight_plan.env_changes, preflight_plan.node_env, preflight_plan.nodes) == \
            (job_plan.env_changes, job_plan.node_env, job_plan.nodes)


def test_the_preflights_launch_imports_neither_torch_nor_deepspeed():
    proc = subprocess.run([sys.executable, "-c", "import sys, widenet_ds.launch.preflight; "
                                                 "print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr
