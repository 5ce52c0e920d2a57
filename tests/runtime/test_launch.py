"""Launch paths: the rank-environment resolver, the pre-launch checks, `widenet-ds launch` (its plan: rank
counting, thread split, accelerator; refused options; a real launch on this machine's cores) and its
launcher.sh aliases, and real `mpiexec -n 2` runs (process group through our code; same losses as
`widenet-ds launch` under the `deepspeed` launcher)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from widenet_ds.errors import ConfigError, LaunchError
from widenet_ds.runtime.distributed import check_ep_size
from widenet_ds.runtime.host_allocator import GLIBC_KEEP_FREED
from widenet_ds.runtime.launch import LaunchOptions, Machine, failure, parse_launch_args, plan_launch
from widenet_ds.runtime.launch_env import (
    SLURM_PORT_BASE,
    check_hostfile,
    cli,
    first_host,
    resolve_launch_env,
)

from tests.support.launch_inputs import prepare_tiny_corpus, pretrain_args, tiny_model_config, train_losses
from tests.support.launching import REPO, free_port

BIN = Path(sys.executable).parent
LAUNCHER_SH = REPO / "launcher.sh"
WIDENET_DS = [sys.executable, "-m", "widenet_ds.cli"]
TRAIN = [sys.executable, "-m", "widenet_ds.train"]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment without any rank variables of the test process itself, venv tools first."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    return {**env, "PATH": f"{BIN}:{env['PATH']}", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "WIDENET_VENV": str(BIN.parent), **extra}


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


# --- hostfile and world checks -------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_hostfile_with_unresolvable_host_names_host_and_fix(tmp_path):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n# a comment\nno-such-node.invalid slots=8\n")
    with pytest.raises(LaunchError, match=r"host 'no-such-node.invalid' .* does not resolve.*/etc/hosts"):
        check_hostfile(hostfile)


def test_more_ranks_than_slots_is_refused(tmp_path):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n127.0.0.1 slots=1\n")
    assert check_hostfile(hostfile, 3) == {"localhost": 2, "127.0.0.1": 1}
    with pytest.raises(LaunchError, match=r"4 ranks requested but hostfile .* offers 3 slots.*request at most 3"):
        check_hostfile(hostfile, 4)
    # --num_gpus G starts G ranks on every chosen host: each needs G slots.
    with pytest.raises(LaunchError, match=r"2 ranks per node .* fewer slots to 127.0.0.1: 1"):
        check_hostfile(hostfile, num_nodes=2, ranks_per_node=2)
    assert check_hostfile(hostfile, num_nodes=1, ranks_per_node=2) == {"localhost": 2}
    with pytest.raises(LaunchError, match=r"3 nodes requested but hostfile .* lists 2 hosts"):
        check_hostfile(hostfile, num_nodes=3)


@pytest.mark.parametrize("text, message", [
    ("localhost 2\n", r"is not `<host> slots=<N>`"),
    ("localhost slots=2\nlocalhost slots=2\n", r"listed twice"),
    ("localhost slots=0\n", r"slots=0"),
    ("# only a comment\n", r"lists no hosts"),
])
def test_malformed_hostfile_names_the_line(tmp_path, text, message):
    with pytest.raises(LaunchError, match=message):
        check_hostfile(write(tmp_path / "hosts", text))


def test_missing_hostfile(tmp_path):
    with pytest.raises(LaunchError, match=r"does not exist.*leave out --hostfile"):
        check_hostfile(tmp_path / "nope")


def test_check_hostfile_cli(tmp_path, capsys):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n")
    assert cli(["check-hostfile", "--hostfile", str(hostfile), "--num-ranks", "2"]) == 0
    assert capsys.readouterr().out.strip() == "localhost:2"
    assert cli(["check-hostfile", "--hostfile", str(hostfile), "--num-gpus", "3"]) == 2
    assert "request at most 2 GPUs per node" in capsys.readouterr().err


def test_ep_size_must_divide_world_size_and_experts():
    check_ep_size(2, world_size=4, num_experts=8)
    check_ep_size(1, world_size=3, num_experts=None)
    with pytest.raises(ConfigError, match=r"--ep-size 4 does not divide the 2 rank\(s\); use one of \[1, 2\]"):
        check_ep_size(4, world_size=2, num_experts=4)
    with pytest.raises(ConfigError, match=r"--ep-size 2 does not divide the model's 3 experts"):
        check_ep_size(2, world_size=2, num_experts=3)
    with pytest.raises(ConfigError, match=r"the model is dense"):
        check_ep_size(2, world_size=2, num_experts=None)
    with pytest.raises(ConfigError, match=r"positive integer"):
        check_ep_size(0, world_size=2, num_experts=4)


# --- widenet-ds launch ----------------------------------------------------------------------------
def plan(machine: Machine, environ: dict[str, str] | None = None, **options) -> tuple[list[str], dict[str, str]]:
    launch = plan_launch(LaunchOptions("pretrain", ("--data", "d"), **options), machine, environ or {})
    return launch.command, launch.env_changes


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


@pytest.mark.parametrize("cores, ranks, threads", [(2, 2, 1), (6, 6, 1), (16, 8, 2), (64, 8, 8), (1, 1, 1)])
def test_cpu_machine_gets_one_rank_per_core_at_most_8_sharing_the_cores(cores, ranks, threads):
    command, env = plan(Machine(cores=cores, has_gpu=False))
    assert option(command, "--num_gpus") == str(ranks)
    assert env["OMP_NUM_THREADS"] == str(threads) and env["DS_ACCELERATOR"] == "cpu"
    # the trainer through its module entry, the task's options unchanged after it
    assert command[command.index("--module"):] == ["--module", "widenet_ds.train", "pretrain", "--data", "d"]
    assert "--log_level=critical" in command and int(option(command, "--master_port")) > 0


def test_cpu_ranks_asked_for_and_the_users_threads_and_accelerator_are_kept():
    command, env = plan(Machine(cores=16, has_gpu=False), {"OMP_NUM_THREADS": "3", "DS_ACCELERATOR": "cpu"},
                        ranks_per_node=4)
    assert option(command, "--num_gpus") == "4" and "OMP_NUM_THREADS" not in env and "DS_ACCELERATOR" not in env
    _, env = plan(Machine(cores=16, has_gpu=False), ranks_per_node=4)
    assert env["OMP_NUM_THREADS"] == "4"


def test_cpu_ranks_get_an_allocator_that_keeps_freed_memory_unless_the_user_chose_one():
    _, env = plan(Machine(cores=2, has_gpu=False, tcmalloc="libtcmalloc_minimal.so.4"))
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4" and "GLIBC_TUNABLES" not in env
    _, env = plan(Machine(cores=2, has_gpu=False, tcmalloc=None))
    assert env["GLIBC_TUNABLES"] == GLIBC_KEEP_FREED and "LD_PRELOAD" not in env
    for users in ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, {"LD_PRELOAD": "libjemalloc.so.2"}):
        _, env = plan(Machine(cores=2, has_gpu=False, tcmalloc="libtcmalloc_minimal.so.4"), users)
        assert "LD_PRELOAD" not in env and "GLIBC_TUNABLES" not in env  # theirs stays in the runner's environment


def test_gpu_machine_leaves_the_rank_count_and_threads_to_deepspeed():
    command, env = plan(Machine(cores=64, has_gpu=True), {"WIDENET_DEEPSPEED_LOG_LEVEL": "info"})
    assert "--num_gpus" not in command and "OMP_NUM_THREADS" not in env and "DS_ACCELERATOR" not in env
    assert "GLIBC_TUNABLES" not in env
    assert "--log_level=info" in command
    command, _ = plan(Machine(cores=64, has_gpu=True), ranks_per_node=4, master_port=31000, master_addr="10.0.0.2")
    assert (option(command, "--num_gpus"), option(command, "--master_port"), option(command, "--master_addr")) == \
        ("4", "31000", "10.0.0.2")


def test_hostfile_is_checked_then_handed_to_deepspeed(tmp_path):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n127.0.0.1 slots=2\n")
    command, _ = plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, num_nodes=2, ranks_per_node=2,
                      ssh_check=False)
    assert (option(command, "--hostfile"), option(command, "--num_nodes")) == (str(hostfile), "2")
    assert "--no_ssh_check" in command and "--master_port" not in command  # deepspeed's, agreed by every node
    with pytest.raises(LaunchError, match=r"3 ranks per node .* request at most 2 GPUs per node"):
        plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, ranks_per_node=3)


def test_a_hostfile_launch_gives_pdshs_ssh_keepalives_after_the_users_own_options(tmp_path):
    """A node that vanishes mid-run closes no connection: without keep-alives pdsh's ssh, and the run, wait for it
    for ever (the real case: tests/integration/test_two_nodes.py)."""
    hostfile = write(tmp_path / "hosts", "localhost slots=1\n127.0.0.1 slots=1\n")
    _, env = plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, num_nodes=1)
    assert env["PDSH_SSH_ARGS_APPEND"] == "-o ServerAliveInterval=5 -o ServerAliveCountMax=4 -o ConnectTimeout=15"
    _, env = plan(Machine(cores=2, has_gpu=False), {"PDSH_SSH_ARGS_APPEND": "-o ServerAliveInterval=60"},
                  hostfile=hostfile, num_nodes=1)
    assert env["PDSH_SSH_ARGS_APPEND"].startswith("-o ServerAliveInterval=60 -o ServerAliveInterval=5")  # ssh: 1st wins
    assert "PDSH_SSH_ARGS_APPEND" not in plan(Machine(cores=2, has_gpu=False))[1]  # one machine: no ssh


def test_a_loopback_rendezvous_address_for_several_nodes_is_refused_naming_the_first_node(tmp_path):
    hostfile = write(tmp_path / "hosts", f"localhost slots=1\n{socket.gethostname()} slots=1\n")
    for address in ("127.0.0.1", "localhost", "::1"):
        with pytest.raises(LaunchError, match=rf"--master-addr {re.escape(address)} is a loopback address, and the "
                                              rf"ranks run on 2 nodes: .*never reach.*leave out --master-addr"):
            plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, num_nodes=2, master_addr=address)
    # one node of the file, or an address the nodes reach: accepted
    plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, num_nodes=1, master_addr="127.0.0.1")
    plan(Machine(cores=2, has_gpu=False), hostfile=hostfile, num_nodes=2, master_addr="10.77.0.1")


def test_a_loopback_master_addr_in_a_multi_node_slurm_step_is_refused_once():
    with pytest.raises(LaunchError, match=r"MASTER_ADDR 127\.0\.0\.1 is a loopback address, and the ranks run on 4 "
                                          r"nodes.*Unset MASTER_ADDR, and the first host of the job is used") as err:
        resolve_launch_env({**SLURM_STEP, "SLURM_STEP_NUM_NODES": "4", "MASTER_ADDR": "127.0.0.1"})
    assert err.value.same_on_every_rank  # printed by rank 0 only
    assert resolve_launch_env({**SLURM_STEP, "SLURM_STEP_NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1"}).rank == 3


def test_launch_options_before_the_separator_task_options_after_it():
    options = parse_launch_args(["squad", "--num-gpus", "3", "--no-ssh-check", "--", "--version", "2.0", "--", "x"])
    assert (options.task, options.ranks_per_node, options.ssh_check) == ("squad", 3, False)
    assert options.train_args == ("--version", "2.0", "--", "x")
    with pytest.raises(LaunchError, match=r"--num-nodes 2 needs --hostfile"):
        parse_launch_args(["glue", "--num-nodes", "2"])


def test_exit_status_of_a_failed_run_is_explained():
    assert failure(1) == "a rank failed; its messages are above"
    assert failure(247) == "a rank was killed by SIGKILL"  # launch.py's sys.exit(-9)
    assert failure(143) == "the deepspeed runner was killed by SIGTERM"
    assert failure(255).startswith("ssh's own failure: a node was down, unreachable")  # not SIGHUP (256 - 255)


@pytest.mark.parametrize("front", [[str(LAUNCHER_SH), "pretrain"], [*WIDENET_DS, "launch", "pretrain"]],
                         ids=["launcher.sh", "widenet-ds"])
def test_bad_hostfile_is_refused_before_deepspeed_starts(tmp_path, front):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\nno-such-node.invalid slots=2\n")
    start = time.monotonic()
    proc = subprocess.run([*front, "--hostfile", str(hostfile), "--", "--anything"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no-such-node.invalid" in proc.stderr and "remove its line" in proc.stderr
    assert proc.stderr.count("error") == 1, proc.stderr
    assert "widenet-ds launch: " not in proc.stdout  # never got as far as the launcher
    assert time.monotonic() - start < 20

    proc = subprocess.run([*front, "--hostfile", str(write(tmp_path / "one", "localhost slots=2\n")),
                           "--num-gpus", "4", "--", "--anything"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "request at most 2 GPUs per node" in proc.stderr


@pytest.mark.multirank
def test_launch_starts_one_rank_per_core_on_this_machine():
    """The real count: every rank the runner starts prints the task's help once."""
    cores = len(os.sched_getaffinity(0))
    ranks = min(cores, 8)
    env = {k: v for k, v in subprocess_env().items() if k not in ("OMP_NUM_THREADS", "DS_ACCELERATOR")}
    proc = subprocess.run([*WIDENET_DS, "launch", "classify", "--", "--help"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    echo = proc.stdout.splitlines()[0]
    assert echo.startswith(f"widenet-ds launch: DS_ACCELERATOR=cpu OMP_NUM_THREADS={cores // ranks} ")
    assert f" --num_gpus {ranks} " in echo and echo.endswith("--module widenet_ds.train classify --help")
    assert proc.stdout.count("usage: ") == ranks


# --- real multi-process launches -----------------------------------------------------------------
ALL_REDUCE = """
import json, os, sys, torch, torch.distributed as dist
from widenet_ds.runtime.distributed import init_distributed
from widenet_ds.runtime.launch_env import resolve_launch_env
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
                          env=subprocess_env(), capture_output=True, text=True, timeout=180)
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
                         env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert mpi.returncode == 0, mpi.stdout[-3000:] + mpi.stderr[-3000:]
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n")
    ds = subprocess.run([*WIDENET_DS, "launch", "pretrain", "--hostfile", str(hostfile), "--master-addr", "127.0.0.1",
                         "--master-port", str(free_port()), "--no-ssh-check", "--",
                         *pretrain_args(corpus, model, tmp_path / "ds", steps, ep_size=2)],
                        env=subprocess_env(), capture_output=True, text=True, timeout=300)
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
                          env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "--ep-size 4 does not divide the 2 rank(s)" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - start < 60
