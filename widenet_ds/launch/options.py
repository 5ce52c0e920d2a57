"""The command line of `widenet-ds launch TASK [launch options] -- [options of the task]`: the launch options (the
job's shape: ranks per node, nodes, hostfile, rendezvous), and what the local machine offers the ranks."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from widenet_ds.errors import LaunchError
from widenet_ds.launch.host_allocator import find_tcmalloc
from widenet_ds.tasks import TASKS
from widenet_ds.training.command_line import build_parser

PROG = "widenet-ds launch"
TRAIN_MODULE = "widenet_ds.train"  # its tasks: widenet_ds/tasks/
LOG_LEVEL_VAR = "WIDENET_DEEPSPEED_LOG_LEVEL"
# Device memory of the GPUs a job is often sized for, GiB (`--dry-run --gpu NAME`).
GPU_MEMORY_GIB = {"H100": 80.0, "H200": 141.0, "A100-40GB": 40.0, "A100-80GB": 80.0}


@dataclass(frozen=True)
class DryRun:
    """`--dry-run` and its own options (launch/dry_run.py): the devices the job will run on, and the sequence length
    to size for where its data is not on this machine."""

    gpus: bool = False                     # its ranks are GPUs (--gpus-per-node, --gpu or --device-memory given)
    gpu: str | None = None                 # a name of GPU_MEMORY_GIB
    device_memory_gib: float | None = None
    seq_length: int | None = None


@dataclass(frozen=True)
class LaunchOptions:
    task: str
    train_args: tuple[str, ...] = ()
    ranks_per_node: int | None = None  # deepspeed's --num_gpus; None: every GPU, or one rank per core
    num_nodes: int | None = None
    hostfile: Path | None = None
    master_addr: str | None = None
    master_port: int | None = None
    ssh_check: bool = True
    run_config: Path | None = None  # a run's saved settings (run_config.json), read by launch/task_options.py
    dry_run: DryRun | None = None  # plan the job on this machine, start no rank (launch/dry_run.py)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise LaunchError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        if self.num_nodes is not None and self.num_nodes > 1 and self.hostfile is None and self.dry_run is None:
            raise LaunchError(f"--num-nodes {self.num_nodes} needs --hostfile listing the nodes "
                              f"(one `<host> slots=<N>` line each)")


@dataclass(frozen=True)
class Machine:
    """What the local machine offers the ranks."""

    cores: int
    has_gpu: bool
    tcmalloc: str | None = None  # its library, where installed (host_allocator.find_tcmalloc)


def this_machine(environ: Mapping[str, str] = os.environ) -> Machine:
    cores = len(os.sched_getaffinity(0))
    accelerator = environ.get("DS_ACCELERATOR")
    if accelerator:  # the user's choice stands
        return Machine(cores, has_gpu=accelerator != "cpu", tcmalloc=find_tcmalloc())
    nvidia_smi = shutil.which("nvidia-smi")
    has_gpu = nvidia_smi is not None and subprocess.run([nvidia_smi, "-L"], capture_output=True).returncode == 0
    return Machine(cores, has_gpu, find_tcmalloc())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        # deepspeed would take 0 ranks silently and run 1
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give one of 1024..65535")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, usage=f"{PROG} {{{','.join(TASKS)}}} [launch options] -- [options of the task]",
        description="Run `python -m widenet_ds.train TASK` on several ranks under the deepspeed launcher. "
                    "Everything after `--` goes to the task unchanged (`widenet-ds launch TASK --help` lists its "
                    "options with these).",
        epilog=f"Environment: {LOG_LEVEL_VAR} (default critical) sets the deepspeed runner's log level; "
               "OMP_NUM_THREADS and DS_ACCELERATOR, when set, are kept. SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 to "
               "this process: the ranks save a checkpoint and exit 0; continue with the same command plus --resume.")
    p.add_argument("task", choices=TASKS, metavar="TASK",
                   help=" ".join(f"{name}: {spec.description}" for name, spec in TASKS.items()))
    p.add_argument("--num-ranks", "--num-gpus", dest="ranks_per_node", type=_positive_int, metavar="N",
                   help="ranks per node (default: every GPU; without GPUs one CPU rank per core, at most 8)")
    p.add_argument("--hostfile", type=Path, metavar="FILE",
                   help="nodes to run on, deepspeed's format (`<host> slots=<N>` per line; passwordless ssh + "
                        "pdsh); checked first: hosts must resolve and have the slots asked for")
    p.add_argument("--num-nodes", type=_positive_int, metavar="N", help="the first N hosts of the hostfile")
    p.add_argument("--master-addr", metavar="ADDR",
                   help="rendezvous address (default: 127.0.0.1 locally; deepspeed asks the first host)")
    p.add_argument("--master-port", type=_port, metavar="PORT",
                   help="rendezvous port (default: a free one locally; 29500 with a hostfile)")
    p.add_argument("--no-ssh-check", dest="ssh_check", action="store_false",
                   help="skip deepspeed's ssh probe of the first host")
    p.add_argument("--config", dest="run_config", type=Path, metavar="RUN_CONFIG",
                   help="the task's options from a run's run_config.json (or its run folder), to run it again or "
                        "continue it elsewhere; options after `--` follow them (a later option wins, e.g. "
                        "--output-dir, --resume)")
    p.add_argument("--gpus-per-node", type=_positive_int, metavar="G",
                   help="GPU ranks per node (as Slurm's --gpus-per-node; the same as --num-ranks G, on GPUs)")
    dry = p.add_argument_group("dry run", "plan the job here without starting it (docs/cluster.md)")
    dry.add_argument("--dry-run", action="store_true",
                     help="the checks the job's start-up makes for this shape, its ranks' groups and each device's "
                          "memory, in this process on any machine (no GPU needed); no rank starts, nothing is written")
    dry.add_argument("--gpu", type=str.upper, choices=list(GPU_MEMORY_GIB), metavar="NAME",
                     help=f"the job's GPU model, for its memory: "
                          f"{', '.join(f'{k} {v:g} GiB' for k, v in GPU_MEMORY_GIB.items())} (default: this machine's "
                          f"GPU, as nvidia-smi names and sizes it)")
    dry.add_argument("--device-memory", type=_positive_float, metavar="GIB",
                     help="memory of each of the job's devices, GiB (over --gpu's)")
    dry.add_argument("--seq-length", type=_positive_int, metavar="N",
                     help="sequence length to size for where the --data folder is not on this machine (default: the "
                          "model's max_position_embeddings)")
    return p


def launch_help(task: str | None) -> str:
    """`widenet-ds launch [TASK] --help`: the launch options, and with a TASK its own options (those after `--`) on
    the same page, which this process prints alone (no rank starts for a help)."""
    p = parser()
    if task is None:
        return p.format_help()
    p.usage = f"{PROG} {task} [launch options] -- [{task} options]"
    p.description = (f"{TASKS[task].description} Run on several ranks under the deepspeed launcher; everything after "
                     f"`--` goes to the task unchanged. Batch sizes, learning rate, schedule, precision and ZeRO stage "
                     f"come from the DeepSpeed JSON only (docs/flags.md: every flag of every task).")
    next(a for a in p._actions if a.dest == "task").help = argparse.SUPPRESS  # (named by the usage)
    epilog, p.epilog = p.epilog, None
    task_parser = build_parser(TASKS[task].config)
    formatter = task_parser._get_formatter()
    for group in task_parser._action_groups:
        actions = [a for a in group._group_actions if a.dest != "help"]
        if not actions:
            continue
        own = group is task_parser._optionals
        formatter.start_section(f"{task} options, after `--`" + ("" if own else f": {group.title}"))
        formatter.add_text(None if own else group.description)
        formatter.add_arguments(actions)
        formatter.end_section()
    formatter.add_text(epilog)
    return p.format_help() + "\n" + formatter.format_help()


def parse_launch_args(argv: list[str]) -> LaunchOptions:
    """Launch options before `--`, the task's options after it. argparse errors exit 2 with one line; `--help`
    (before or after `--`) prints `launch_help` and exits 0."""
    cut = argv.index("--") if "--" in argv else len(argv)
    launch_args, train_args = argv[:cut], argv[cut + 1:]
    if {"-h", "--help"} & set(argv):
        print(launch_help(next((arg for arg in launch_args if arg in TASKS), None)), end="", flush=True)
        raise SystemExit(0)
    p = parser()
    args, unknown = p.parse_known_args(launch_args)
    if unknown:
        known = ", ".join(a.option_strings[0] for a in p._actions if a.option_strings and a.dest != "help")
        p.error(f"unknown launch option {unknown[0]!r}; the launch options are {known}, and the task's own "
                f"options go after `--`")
    if args.ranks_per_node is not None and args.gpus_per_node is not None:
        p.error("--num-ranks and --gpus-per-node both give the ranks per node; give one")
    sized = {"--gpu": args.gpu, "--device-memory": args.device_memory, "--seq-length": args.seq_length}
    if not args.dry_run and any(value is not None for value in sized.values()):
        p.error(f"{', '.join(k for k, v in sized.items() if v is not None)} size a job's plan: add --dry-run, or "
                f"leave them out to start the job")
    dry_run = DryRun(args.gpus_per_node is not None or args.gpu is not None or args.device_memory is not None,
                     args.gpu, args.device_memory, args.seq_length) if args.dry_run else None
    return LaunchOptions(task=args.task, train_args=tuple(train_args),
                         ranks_per_node=args.ranks_per_node or args.gpus_per_node, num_nodes=args.num_nodes,
                         hostfile=args.hostfile, master_addr=args.master_addr, master_port=args.master_port,
                         ssh_check=args.ssh_check, run_config=args.run_config, dry_run=dry_run)

