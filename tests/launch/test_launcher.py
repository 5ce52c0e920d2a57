"""`widenet-ds launch`: its plan (rank counting, thread split, accelerator, ssh keep-alives, the rendezvous
address), refused options, the exit status explained, its launcher.sh aliases and a real launch on this machine's
cores."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launching import (
    LAUNCHER_SH,
    WIDENET_DS,
    launcher_env,
)
from widenet_ds.errors import LaunchError
from widenet_ds.launch.host_allocator import GLIBC_KEEP_FREED
from widenet_ds.launch.launcher import failure, plan_launch
from widenet_ds.launch.options import LaunchOptions, Machine, parse_launch_args
from widenet_ds.tasks import TASKS
from widenet_ds.training.command_line import build_parser


# --- widenet-ds launch ----------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


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


def test_the_plan_knows_how_many_ranks_it_starts(tmp_path):
    """What the launch's own checks compare --ep-size and the batch with (launch/job_checks.py)."""
    def world(machine: Machine, **options) -> int | None:
        return plan_launch(LaunchOptions("pretrain", (), **options), machine, {}).world_size

    assert world(Machine(cores=6, has_gpu=False)) == 6 and world(Machine(cores=64, has_gpu=False)) == 8
    assert world(Machine(cores=2, has_gpu=True), ranks_per_node=4) == 4
    assert world(Machine(cores=2, has_gpu=True)) is None  # every GPU: deepspeed counts them
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n127.0.0.1 slots=3\n")
    assert world(Machine(cores=2, has_gpu=True), hostfile=hostfile) == 5  # each host's slots
    assert world(Machine(cores=2, has_gpu=True), hostfile=hostfile, ranks_per_node=2) == 4
    assert world(Machine(cores=2, has_gpu=True), hostfile=hostfile, num_nodes=1) == 2


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
                          env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no-such-node.invalid" in proc.stderr and "remove its line" in proc.stderr
    assert proc.stderr.count("error") == 1, proc.stderr
    assert "widenet-ds launch: " not in proc.stdout  # never got as far as the launcher
    assert time.monotonic() - start < 20

    proc = subprocess.run([*front, "--hostfile", str(write(tmp_path / "one", "localhost slots=2\n")),
                           "--num-gpus", "4", "--", "--anything"],
                          env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "request at most 2 GPUs per node" in proc.stderr


@pytest.mark.multirank
def test_launch_starts_one_rank_per_core_on_this_machine(tmp_path):
    """The real count: the processes deepspeed's launch.py spawns (its own log, at level info), each of which finds
    the data missing (said once for all of them)."""
    cores = len(os.sched_getaffinity(0))
    ranks = min(cores, 8)
    env = {k: v for k, v in launcher_env(WIDENET_DEEPSPEED_LOG_LEVEL="info").items()
           if k not in ("OMP_NUM_THREADS", "DS_ACCELERATOR")}
    task = ["--model-config", "widenet-vit-digits", "--dataset", "imagenet-folder", "--data", str(tmp_path / "none"),
            "--deepspeed-config", str(tmp_path / "none.json"), "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run([*WIDENET_DS, "launch", "classify", "--", *task], env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    echo = proc.stdout.splitlines()[0]
    assert echo.startswith(f"widenet-ds launch: DS_ACCELERATOR=cpu OMP_NUM_THREADS={cores // ranks} ")
    assert f" --num_gpus {ranks} " in echo and echo.endswith(f"--module widenet_ds.train classify {' '.join(task)}")
    assert len(re.findall(r"process \d+ spawned with command", output)) == ranks, output[-3000:]
    assert output.count(f"--data {tmp_path / 'none'} does not exist") == 1, output[-3000:]


@pytest.mark.parametrize("task", TASKS)
def test_a_tasks_help_is_one_page_printed_once_without_a_rank(task):
    """`widenet-ds launch TASK --help` and `... -- --help`: the launch options and every option of the task, in this
    process alone (no rank starts, neither torch nor DeepSpeed is imported)."""
    code = ("import sys\nfrom widenet_ds.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as exit_:\n"
            "    assert exit_.code == 0, exit_.code\n"
            "print('imported:', sorted(m for m in ('torch', 'deepspeed') if m in sys.modules), file=sys.stderr)")
    pages = []
    for argv in (["launch", task, "--help"], ["launch", task, "--", "--help"], ["launch", "--num-ranks", "2", task,
                                                                               "--", "--output-dir", "o", "-h"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], env=launcher_env(COLUMNS="120"),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "imported: []\n", proc.stderr
        pages.append(proc.stdout)
    assert pages[0] == pages[1] == pages[2]
    page = pages[0]
    assert page.count("usage: ") == 1 and page.startswith(f"usage: widenet-ds launch {task} [launch options] -- ")
    flags = [o for a in build_parser(TASKS[task].config)._actions for o in a.option_strings if a.dest != "help"]
    after = page.split(f"{task} options, after `--`", 1)[1]
    assert all(re.search(rf"(^|[ ,]){re.escape(flag)}\b", after, re.MULTILINE) for flag in flags), \
        [flag for flag in flags if flag not in after]
    assert "--hostfile FILE" in page.split(f"{task} options, after `--`", 1)[0]  # the launch options first


def test_the_launch_help_without_a_task_names_the_tasks_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_launch_args(["--help"])
    assert exit_.value.code == 0
    page = capsys.readouterr().out
    assert "`widenet-ds launch TASK --help` lists its options" in " ".join(page.split())
    assert all(name in page for name in TASKS)
