"""`widenet-ds launch TASK [launch options] -- ARGS`: a training run on N ranks under DeepSpeed's launcher.

It starts `deepspeed [options] --module widenet_ds.train TASK ARGS` and adds what calling `deepspeed` by
hand lacks:
  - bad launch options, hostfiles and task options stop the launch with one error before anything starts; a local run
    gets a free rendezvous port (a --master-port another program holds is refused, naming it);
  - without a GPU: one CPU rank per core, at most 8 (deepspeed's CPU default is one rank per NUMA node,
    often 1), OMP threads shared between them, DS_ACCELERATOR=cpu chosen instead of guessed, and an allocator
    that keeps freed memory for the next step (launch/host_allocator.py);
  - the runner's bookkeeping (cmd =, WORLD INFO, spawned ...) silenced: WIDENET_DEEPSPEED_LOG_LEVEL;
  - this process stays the one a user or scheduler signals: SIGTERM, SIGINT and SIGUSR1 go to the ranks
    themselves (launch/signals.py says why), which save, agree on the step and exit 0;
  - the run's exit status, with one line when a rank failed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import widenet_ds
from widenet_ds.distributed.launch_env import check_rendezvous_address
from widenet_ds.distributed.ports import free_port, port_holder, port_is_free
from widenet_ds.errors import LaunchError
from widenet_ds.launch.host_allocator import allocator_env
from widenet_ds.launch.hostfile import check_hostfile
from widenet_ds.launch.job_checks import check_job, complete_line
from widenet_ds.launch.node_env import ranks_env, runner_env_file
from widenet_ds.launch.node_failures import NodeWatch, failure
from widenet_ds.launch.options import (
    LOG_LEVEL_VAR,
    PROG,
    TRAIN_MODULE,
    LaunchOptions,
    Machine,
    parse_launch_args,
    this_machine,
)
from widenet_ds.launch.signals import forward, pressed
from widenet_ds.launch.task_options import check_task_options, with_saved_settings
from widenet_ds.training.run_config import RunConfig

MAX_CPU_RANKS = 8
# A terminal's Ctrl-C (INT) and a closed terminal (HUP) stop the run like a scheduler's TERM: saved, exit 0.
# pdsh's ssh: a keep-alive every 5 s, 4 unanswered ones end the session (a vanished node is seen within 20-25 s)
SSH_OPTIONS = ("-o ServerAliveInterval=5", "-o ServerAliveCountMax=4", "-o ConnectTimeout=15")
SSH_SILENCE_S = 25
CLEAR_LINE = "\r\x1b[K"
RELAYED = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM,
           signal.SIGUSR1: signal.SIGUSR1}


@dataclass(frozen=True)
class LaunchPlan:
    command: list[str]
    env_changes: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    # With a hostfile: what every node's ranks must get, which the runner's ssh does not carry (launch/node_env.py)
    node_env: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()  # with a hostfile: the nodes the run uses
    world_size: int | None = None  # the ranks it starts (None: every GPU of this machine, counted by deepspeed)

    def echo(self) -> str:
        shown = {k: v for k, v in self.env_changes.items() if k != "PYTHONPATH"}
        return shlex.join([f"{k}={v}" for k, v in shown.items()] + self.command)


def deepspeed_runner() -> str:
    """The `deepspeed` of this Python environment: it starts the ranks with the same interpreter."""
    beside = Path(sys.executable).parent / "deepspeed"
    found = str(beside) if beside.is_file() else shutil.which("deepspeed")
    if found is None:
        raise LaunchError(f"the `deepspeed` command is not installed beside {sys.executable} nor on PATH; "
                          f"run ./launcher.sh setup, or `pip install deepspeed` in this environment")
    return found


def plan_launch(options: LaunchOptions, machine: Machine, environ: Mapping[str, str] = os.environ,
                runner: str = "deepspeed") -> LaunchPlan:
    """The runner's command line and environment; checks the hostfile first."""
    ds_args: list[str] = []
    ranks = options.ranks_per_node
    nodes: tuple[str, ...] = ()
    world: int | None = None
    if options.hostfile is not None:
        # Unresolvable hosts, malformed lines or too few slots: one error naming the line, no rank started.
        slots = check_hostfile(options.hostfile, num_nodes=options.num_nodes, ranks_per_node=ranks)
        nodes, world = tuple(slots), sum(ranks or count for count in slots.values())
        if options.master_addr is not None:
            check_rendezvous_address(options.master_addr, len(nodes), "--master-addr", f"leave out --master-addr "
                                     f"(deepspeed then asks {nodes[0]} for its address over ssh)", first=nodes[0])
        ds_args += ["--hostfile", str(options.hostfile)]
        if options.num_nodes is not None:
            ds_args += ["--num_nodes", str(options.num_nodes)]
    elif ranks is None and not machine.has_gpu:
        ranks = min(machine.cores, MAX_CPU_RANKS)
    if ranks is not None:
        ds_args += ["--num_gpus", str(ranks)]
        world = world or ranks
    if options.master_addr is not None:
        ds_args += ["--master_addr", options.master_addr]
    # One machine: a free port, so that two runs on it do not both take deepspeed's 29500; a port given for
    # it must be free now (on several nodes rank 0 checks it on the first host).
    port = options.master_port or (free_port() if options.hostfile is None else None)
    if options.master_port is not None and options.hostfile is None and not port_is_free(options.master_port):
        raise LaunchError(f"--master-port {options.master_port} is in use on this machine by "
                          f"{port_holder(options.master_port)}; pass another port (e.g. --master-port {free_port()}), "
                          f"or leave out --master-port to have a free one picked")
    if port is not None:
        ds_args += ["--master_port", str(port)]
    if not options.ssh_check:
        ds_args.append("--no_ssh_check")
    ds_args.append(f"--log_level={environ.get(LOG_LEVEL_VAR) or 'critical'}")

    env: dict[str, str] = {}
    if not machine.has_gpu:
        if not environ.get("DS_ACCELERATOR"):
            env["DS_ACCELERATOR"] = "cpu"  # no "unable to detect an accelerator" warning per process
        if not environ.get("OMP_NUM_THREADS") and ranks is not None:
            # Share the cores instead of every rank starting one thread per core.
            env["OMP_NUM_THREADS"] = str(max(1, machine.cores // ranks))
        env.update(allocator_env(environ, machine.tcmalloc))
    # The ranks import the widenet_ds this process runs, also from a checkout the environment does not
    # have installed (a second worktree).
    source_root = str(Path(widenet_ds.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, environ.get("PYTHONPATH")) if p)
    node_env = ranks_env(environ, env) if options.hostfile is not None else {}
    if options.hostfile is not None:
        env.update(ssh_keepalive_env(environ))
    return LaunchPlan([runner, *ds_args, "--module", TRAIN_MODULE, options.task, *options.train_args], env, node_env,
                      nodes, world)


def ssh_keepalive_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The ssh options of pdsh, DeepSpeed's multi-node runner: keep-alives, so that a node that vanishes mid-run
    (powered off, its link cut: no connection is ever closed) ends its ssh within SSH_SILENCE_S and pdsh reports it
    (`ssh exited with exit code 255`, which NodeWatch acts on), and a connect timeout, so that stopping the run
    (DeepSpeed's `pdsh ... pkill` on every node) does not wait minutes for that node. The user's own
    PDSH_SSH_ARGS_APPEND comes first: for each option ssh takes the first value given."""
    theirs = environ.get("PDSH_SSH_ARGS_APPEND", "").strip()
    return {"PDSH_SSH_ARGS_APPEND": " ".join(part for part in (theirs, *SSH_OPTIONS) if part)}


def run(plan: LaunchPlan) -> int:
    """Start the runner, relay stop signals to the ranks, and return the run's exit status."""
    print(f"{PROG}: {plan.echo()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="widenet-launch-") as folder:
        env = {**os.environ, **plan.env_changes}
        if plan.node_env:
            env.update(runner_env_file(plan.node_env, Path(folder)))
        return _run_runner(plan.command, env, plan.nodes)


def _run_runner(command: list[str], env: dict[str, str], nodes: tuple[str, ...]) -> int:
    # Its own process group: a terminal's Ctrl-C reaches this process only, which relays it as a TERM
    # (the ranks would otherwise die of the INT while deepspeed's launch.py kills the rest).
    runner = subprocess.Popen(command, env=env, process_group=0, stderr=subprocess.PIPE if nodes else None)
    # Several nodes: one that failed must not leave the run waiting for the others (launch/node_failures.py).
    watch = NodeWatch(runner, nodes=nodes, env=env) if nodes else None

    def relay(signum: int, frame) -> None:
        received = signal.Signals(signum)
        message = forward(RELAYED[received], runner.pid)
        try:
            said = message if RELAYED[received] == received else f"{pressed(received)}: {message}"
            # On a terminal, in place of the line the cursor is on (the "^C" echoed there, or a rank's progress bar,
            # which the rank draws again below): the ANSI carriage return and erase-line.
            print(f"{CLEAR_LINE if sys.stderr.isatty() else ''}{PROG}: {said}", file=sys.stderr, flush=True)
        except OSError:  # the terminal has gone (HUP)
            pass

    # A signal ignored when we started (`nohup`, a background job of a script) stays ignored.
    previous = {sig: signal.signal(sig, relay) for sig in RELAYED if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        status = runner.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.close()
    if watch is not None and watch.stopped:
        status = watch.failed[1]  # the failed node's, not that of the runner we stopped
    if status < 0:  # the runner itself was killed
        status = 128 - status
    # 2 is a user error the ranks printed once; anything else gets a line (their own output is above).
    if status not in (0, 2):
        print(f"{PROG}: the run ended with exit status {status} ({failure(status)})", file=sys.stderr, flush=True)
    return status


def launch(options: LaunchOptions) -> int:
    """Plan (the launch options and hostfile checked), check the task's options and what the job's shape lets the
    launcher know (launch/job_checks.py), then start the ranks; a --resume of a finished run starts none."""
    if options.dry_run is not None:  # (`widenet-ds launch --dry-run` runs launch/dry_run.py, which starts nothing)
        raise LaunchError("--dry-run plans a job without starting it: run it as `widenet-ds launch --dry-run ...`")
    plan = plan_launch(options, this_machine(), runner=deepspeed_runner())
    cfg = check_task_options(options)
    if (complete := complete_line(cfg)) is not None:
        print(f"{PROG}: {complete}", flush=True)
        return 0
    check_job(cfg, plan.world_size)
    return run(plan)


def launch_config(cfg: RunConfig, **launch_options: Any) -> int:
    """Train `cfg` on N ranks: `widenet-ds launch` with the command line `cfg.to_argv()`. `launch_options`:
    LaunchOptions' fields but the task and its options (ranks_per_node, hostfile, ...)."""
    return launch(LaunchOptions(cfg.TASK, tuple(cfg.to_argv()), **launch_options))


def cli(argv: list[str]) -> int:
    options = parse_launch_args(argv)
    if options.run_config is not None:
        options = with_saved_settings(options)
    return launch(options)
