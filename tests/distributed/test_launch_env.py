"""Where a rank sits in the job: the resolver of every launcher's variables (torch-style, MPI, Slurm, plain python),
and real `mpiexec -n 2` runs (process group through our code; the same losses as `widenet-ds launch` under the
`deepspeed` launcher)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.launch_inputs import (
    prepare_tiny_corpus,
    pretrain_args,
    tiny_model_config,
    train_losses,
)
from tests.support.launching import (
    BIN,
    TRAIN,
    WIDENET_DS,
    free_port,
    launcher_env,
)
from widenet_ds.distributed.launch_env import (
    SLURM_PORT_BASE,
    first_host,
    resolve_launch_env,
)
from widenet_ds.errors import LaunchError

# --- resolve_launch_env --------------------------------------------------------------------------
SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
              "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_JOB_NODELIST": "gpu[07-10]",
              "SLURM_STEP_NODELIST": "gpu[07-10]"}


def test_launcher_variables_are_taken_as_they_are():
    environ = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511",
               **SLURM_STEP}  # a `deepspeed` run inside an allocation: the launcher's variables win
    env = resolve_launch_env(environ)
    assert (env.source, env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == \
        ("launcher", 1, 1, 2, "10.0.0.1", 29511)


def test_partial_launcher_variables_name_what_is_missing():
    with pytest.raises(LaunchError, match=r"RANK set but LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT missing"):
        resolve_launch_env({"RANK": "0"})


def test_slurm_step_gives_rank_world_first_host_and_job_port():
    environ = dict(SLURM_STEP)
    env = resolve_launch_env(environ)
    assert (env.source, env.rank, env.local_rank, env.world_size, env.master_addr) == ("slurm", 3, 1, 8, "gpu07")
    assert environ["RANK"] == "3" and environ["WORLD_SIZE"] == "8" and environ["MASTER_ADDR"] == "gpu07"
    assert SLURM_PORT_BASE <= env.master_port < 65536
    # Every task of the step computes the same port; a requeued run of the job gets another one.
    assert resolve_launch_env({**SLURM_STEP, "SLURM_PROCID": "0"}).master_port == env.master_port
    assert resolve_launch_env({**SLURM_STEP, "SLURM_RESTART_COUNT": "1"}).master_port != env.master_port
    assert resolve_launch_env({**SLURM_STEP, "MASTER_PORT": "31000"}).master_port == 31000


def test_slurm_batch_script_with_many_tasks_but_no_srun_fails_naming_srun():
    # What the batch shell itself sees (no SLURM_STEP_ID): python was started without srun.
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
             "SLURM_JOB_NODELIST": "vm"}
    with pytest.raises(LaunchError, match=r"2 tasks but this process was started without srun.*srun python"):
        resolve_launch_env(batch)
    # A 1-task job may run python directly: one rank.
    assert resolve_launch_env({**batch, "SLURM_NTASKS": "1"}).world_size == 1


def test_slurm_step_without_task_count_fails_naming_ntasks():
    environ = {k: v for k, v in SLURM_STEP.items() if k not in ("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")}
    with pytest.raises(LaunchError, match=r"lacks SLURM_NTASKS.*--ntasks=N"):
        resolve_launch_env(environ)


def test_srun_with_pmi2_is_read_from_slurm_without_mpi():
    # srun --mpi=pmi2 sets PMI_RANK == SLURM_PROCID; no mpi4py round trip needed (none could happen here).
    env = resolve_launch_env({**SLURM_STEP, "PMI_RANK": "3", "PMI_SIZE": "8"})
    assert (env.source, env.rank, env.world_size) == ("slurm", 3, 8)


def test_plain_process_is_one_rank_on_loopback():
    environ: dict[str, str] = {}
    env = resolve_launch_env(environ)
    assert (env.source, env.rank, env.world_size, env.master_addr) == ("single", 0, 1, "127.0.0.1")
    assert environ["MASTER_PORT"] == str(env.master_port)


@pytest.mark.parametrize("nodelist, host", [("vm", "vm"), ("gpu[07-09,12]", "gpu07"), ("a[3],b1", "a3"),
                                            ("node-1,node-2", "node-1"), ("rack1-n[0001-0004]", "rack1-n0001")])
def test_first_host_of_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_a_loopback_master_addr_in_a_multi_node_slurm_step_is_refused_once():
    with pytest.raises(LaunchError, match=r"MASTER_ADDR 127\.0\.0\.1 is a loopback address, and the ranks run on 4 "
                                          r"nodes.*Unset MASTER_ADDR, and the first host of the job is used") as err:
        resolve_launch_env({**SLURM_STEP, "SLURM_STEP_NUM_NODES": "4", "MASTER_ADDR": "127.0.0.1"})
    assert err.value.same_on_every_rank  # printed by rank 0 only
    assert resolve_launch_env({**SLURM_STEP, "SLURM_STEP_NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1"}).rank == 3


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- real multi-process launches -----------------------------------------------------------------
ALL_REDUCE = """
import json, os, sys, torch, torch.distributed as dist
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.distributed.launch_env import resolve_launch_env
init_distributed()
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
row = {"rank": dist.get_rank(), "world": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
       "port": int(os.environ["MASTER_PORT"]), "sum": value.item(), "has_pmi": "PMI_RANK" in os.environ}
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as out:  # mpiexec mixes stdout lines
    json.dump(row, out)
"""


@pytest.mark.multirank
def test_mpiexec_two_ranks_initialise_through_launch_env(tmp_path):
    script = write(tmp_path / "all_reduce.py", ALL_REDUCE)
    proc = subprocess.run([str(BIN / "mpiexec"), "-n", "2", sys.executable, str(script), str(tmp_path)],
                          env=launcher_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["world"], r["local_rank"], r["sum"]) for r in rows] == [(0, 2, 0, 3.0), (1, 2, 1, 3.0)]
    assert all(r["has_pmi"] for r in rows)
    # Rank 0's free port, shared over MPI - not DeepSpeed's fixed 29500, which collides between jobs.
    assert rows[0]["port"] == rows[1]["port"] != 29500


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return prepare_tiny_corpus(shared_data, tmp_path_factory.mktemp("corpus") / "alice")


@pytest.mark.multirank
@pytest.mark.slow
def test_mpiexec_and_deepspeed_launcher_give_the_same_losses_with_ep2(tmp_path, corpus):
    model = tiny_model_config(tmp_path / "tiny.json")
    steps = 5
    mpi = subprocess.run([str(BIN / "mpiexec"), "-n", "2", *TRAIN, "pretrain",
                          *pretrain_args(corpus, model, tmp_path / "mpi", steps, ep_size=2)],
                         env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert mpi.returncode == 0, mpi.stdout[-3000:] + mpi.stderr[-3000:]
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n")
    ds = subprocess.run([*WIDENET_DS, "launch", "pretrain", "--hostfile", str(hostfile), "--master-addr", "127.0.0.1",
                         "--master-port", str(free_port()), "--no-ssh-check", "--",
                         *pretrain_args(corpus, model, tmp_path / "ds", steps, ep_size=2)],
                        env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert ds.returncode == 0, ds.stdout[-3000:] + ds.stderr[-3000:]
    assert "--hostfile" in ds.stdout.splitlines()[0]  # widenet-ds launch handed the hostfile to deepspeed

    for run in ("mpi", "ds"):
        final = tmp_path / run / "checkpoints" / f"step{steps}"
        assert json.loads((final / "widenet_checkpoint.json").read_text())["world_size"] == 2
        assert (final / "rank_00000_state.pt").exists() and (final / "rank_00001_state.pt").exists()
    mpi_losses, ds_losses = train_losses(tmp_path / "mpi"), train_losses(tmp_path / "ds")
    assert [step for step, _ in mpi_losses] == list(range(1, steps + 1))
    assert [step for step, _ in ds_losses] == list(range(1, steps + 1))
    torch.testing.assert_close(torch.tensor([loss for _, loss in mpi_losses], dtype=torch.float64),
                               torch.tensor([loss for _, loss in ds_losses], dtype=torch.float64),
                               rtol=1e-6, atol=0)


@pytest.mark.multirank
def test_ep_size_not_dividing_world_size_fails_fast_under_mpiexec(tmp_path, corpus):
    model = tiny_model_config(tmp_path / "tiny.json")
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "mpiexec"), "-n", "2", *TRAIN, "pretrain",
                           *pretrain_args(corpus, model, tmp_path / "run", 5, ep_size=4)],
                          env=launcher_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "--ep-size 4 does not divide the 2 rank(s)" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - start < 60
