"""How a rank's process ends (`exit_rank`, the end of `python -m widenet_ds.train`):
a C++ thread that takes the GIL back while the interpreter finalises aborts the process ("terminate called
without an active exception", SIGABRT) after its work is done, as one CI run's finished 2-rank pretraining
did. A daemon thread multiplying matrices is such a thread (torch releases the GIL inside the product): ended
by `sys.exit` the process aborts, ended by `exit_rank` it exits with its status, its atexit handlers run and
its buffered output is written."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.support.launching import REPO, child_env

SCRIPT = """
import atexit, sys, threading, time
import torch
from widenet_ds.distributed.groups import exit_rank

a = torch.randn(256, 256)

def multiply():
    while True:
        a.mm(a)

threading.Thread(target=multiply, daemon=True).start()
time.sleep(0.2)
atexit.register(lambda: print("atexit handler ran"))
print("buffered line")  # stdout is a pipe: block-buffered, written at exit or lost
{end}
"""


def run(end: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(end=end)], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=120)


def test_sys_exit_with_a_cxx_thread_taking_the_gil_aborts():
    """The failure itself: without it the test below proves nothing."""
    ended = run("sys.exit(3)")
    assert ended.returncode == -signal.SIGABRT, (ended.returncode, ended.stderr[-2000:])
    assert "terminate called without an active exception" in ended.stderr


def test_exit_rank_ends_with_the_status_after_the_atexit_handlers_and_the_output():
    ended = run("exit_rank(3)")
    assert ended.returncode == 3, (ended.returncode, ended.stderr[-2000:])
    assert ended.stdout.splitlines() == ["buffered line", "atexit handler ran"]
    assert "terminate called" not in ended.stderr
