"""The training entry: `python -m widenet_ds.train TASK [options]`, one process per rank; the `train` command of
`widenet-ds` (cli.py: the one dispatcher, its error handling), also reached as `widenet-ds train TASK`.

    deepspeed --module widenet_ds.train pretrain --model-config widenet-base-e4 --data data/phase1 ...
    srun python -m widenet_ds.train glue --glue-task sst2 --data glue/SST-2 --init-from runs/e8 ...
    widenet-ds launch classify --num-ranks 2 -- --model-config widenet-vit-tiny ...
    deepspeed pretrain/run_pretrain.py --model-config ...   (the script forms: pretrain/, finetune/)

TASK: a row of widenet_ds/tasks/ (`--help` lists them). `TASK --help` lists its options.
A user error is printed once (not once per rank) and exits 2; a run stopped by SIGTERM/SIGUSR1 has saved
its checkpoint and exits 0 (Slurm requeues it; --resume continues). A SIGTERM before the process group is up
ends the rank at once (nothing to save; a rank waiting for a rendezvous that never comes runs no handler).
"""

from __future__ import annotations

import difflib
import sys
from typing import NoReturn

from widenet_ds.engine.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

from widenet_ds.cli import quiet_on_closed_pipe, run_command  # noqa: E402
from widenet_ds.distributed.console import process_rank  # noqa: E402
from widenet_ds.distributed.groups import exit_rank  # noqa: E402
from widenet_ds.distributed.launch_env import without_local_rank  # noqa: E402
from widenet_ds.distributed.lost_peer import lost_peer_message  # noqa: E402
from widenet_ds.errors import WideNetError, mark_same_on_every_rank  # noqa: E402
from widenet_ds.run.run_task import run_task  # noqa: E402
from widenet_ds.tasks import TASKS  # noqa: E402
from widenet_ds.training.command_line import parse  # noqa: E402
from widenet_ds.training.run_config import InvalidConfig  # noqa: E402

PROG = "python -m widenet_ds.train"
DISPATCHED = "widenet-ds train"  # the same entry as a command of widenet-ds (cli.py)


def usage(prog: str = PROG) -> str:
    width = max(map(len, TASKS))
    return "\n".join([f"usage: {prog} TASK [options]", "", "tasks:"]
                     + [f"  {name:<{width}}  {spec.description}" for name, spec in TASKS.items()]
                     + ["", f"`{prog} TASK --help` lists the options of one task (docs/flags.md: all of them)."])


def cli(argv: list[str], prog: str = DISPATCHED, task_prog: str | None = None) -> int:
    """The `train` command: TASK and its options, usage and errors named as the entry was started (`prog`; a
    script form's `task_prog`: its own path). A user error (the settings, the files they name, a full disk, a
    command line argparse refuses) is raised to the dispatcher, which prints it once for all ranks and exits 2."""
    argv = without_local_rank(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog))
        return 0
    task, rest = argv[0], argv[1:]
    if task not in TASKS:
        close = difflib.get_close_matches(task, TASKS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"{prog}: unknown task {task!r}.{hint}\n\n{usage(prog)}", file=sys.stderr)
        return 2
    try:
        cfg = parse(TASKS[task].config, rest, prog=task_prog or f"{prog} {task}")
    except InvalidConfig as err:  # refused by run_task with what the settings name on this machine: all at once
        cfg = err.config
    except WideNetError as err:  # every rank parses the same command line
        raise mark_same_on_every_rank(err)
    try:
        run_task(cfg)
    except RuntimeError as err:  # torch's DistBackendError is one
        message = lost_peer_message(err, process_rank(), cfg.output_dir / "checkpoints")
        if message is None:
            raise
        # Not 2 (a user error every rank shares): a rank's own failure, which `widenet-ds launch` reports too.
        print(f"{task_prog or f'{prog} {task}'}: error: {message}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None, task_prog: str | None = None) -> int:
    """`python -m widenet_ds.train TASK ...`: the `train` command, its errors named `python -m widenet_ds.train TASK`
    (a script form's: `task_prog`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    task = without_local_rank(argv)[:1]
    label = task_prog or (" ".join([PROG, *task]) if set(task) <= set(TASKS) else PROG)
    return quiet_on_closed_pipe(lambda: run_command("train", argv, label, lambda args: cli(args, PROG, task_prog)))


def run_script(task: str) -> NoReturn:
    """The entry of the script forms (pretrain/run_pretrain.py, finetune/run_glue.py, finetune/run_squad.py):
    `main` with the script's task put first, usage and errors named by the script's path."""
    exit_rank(main([task, *sys.argv[1:]], task_prog=sys.argv[0]))


if __name__ == "__main__":
    exit_rank(main())
