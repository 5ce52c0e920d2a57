"""Relay a stop signal from `widenet-ds launch` to the training ranks under DeepSpeed's launcher.

On one node `deepspeed` (the runner) starts `python -m deepspeed.launcher.launch`, which starts the
ranks. The runner installs no signal handler there, so a SIGTERM to it ends only the runner, and the
ranks train on, orphaned. launch.py's own handler terminates its children but kills them (SIGKILL)
if they take more than 30 s to exit, and exits 1 -- a rank busy saving a big checkpoint would be cut
off. So `widenet-ds launch` (launch/launcher.py) keeps the runner as its child and, on a stop signal,
sends it to the ranks themselves: each one finishes its step, all agree to stop (`StopRequest`), save
the same step and exit 0; launch.py and the runner then exit 0 on their own.

Before the ranks exist the signal goes to launch.py (it cancels the start), or to the runner; on a
multi-node (pdsh) launch, where the ranks are on other hosts, to the runner, whose handler passes it on.
"""

from __future__ import annotations

import os
import signal

import psutil

LAUNCH_MODULE = "deepspeed.launcher.launch"


def signal_targets(runner_pid: int) -> tuple[list[int], str]:
    """The pids to signal under the runner, and what they are (for the message)."""
    try:
        runner = psutil.Process(runner_pid)
        below = runner.children(recursive=True)
    except psutil.NoSuchProcess:
        return [], "nothing (the launcher has exited)"
    launchers = []
    for proc in below:
        try:
            if LAUNCH_MODULE in " ".join(proc.cmdline()):
                launchers.append(proc)
        except psutil.Error:
            continue
    ranks = [child.pid for launcher in launchers for child in launcher.children()]
    if ranks:
        return ranks, ("the rank, which saves a checkpoint and exits" if len(ranks) == 1 else
                       f"the {len(ranks)} ranks, which save a checkpoint and exit")
    if launchers:
        return [p.pid for p in launchers], "the local launcher (no rank started yet)"
    return [runner_pid], "the deepspeed runner, which passes it to the ranks of every node"


# What a user did, for the signals a terminal sends (the others are named as they are: a scheduler's SIGTERM, ...).
PRESSED = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGHUP: "the terminal closed (SIGHUP)"}


def pressed(sig: signal.Signals) -> str:
    """The signal received, as a user knows it ("Ctrl-C (SIGINT)")."""
    return PRESSED.get(sig, sig.name)


def forward(sig: signal.Signals, runner_pid: int) -> str:
    pids, what = signal_targets(runner_pid)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return f"{sig.name} sent to {what}"
