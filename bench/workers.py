"""Interleaved timing across processes: each variant (a model, a mode, a checkout of the code) set up once in
a worker process of its own, then its repeats taking turns with the others' (A B C A B C ...), so that a
change of the machine's load falls on every variant alike instead of on whichever ran at that moment.

The driver starts the workers (`Worker`), the workers run `serve(...)`: after their set-up they print one
READY line, then run one repeat per `step` line on their stdin and answer with its seconds. A worker may
import `widenet_ds` from another checkout (`checkout=`): the same benchmark then compares two states of
the code, interleaved.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKOUT_ENV = "WIDENET_BENCH_CHECKOUT"


def use_checkout() -> None:
    """In a worker: import `widenet_ds` from the checkout the driver named (default: this one)."""
    checkout = os.environ.get(CHECKOUT_ENV)
    if checkout:
        sys.path.insert(0, checkout)


class Worker:
    """A benchmark subprocess: `argv` set up its variant, then each `step()` times one repeat there."""

    def __init__(self, label: str, argv: list[str], checkout: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.label = label
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        if checkout:
            child_env[CHECKOUT_ENV] = str(Path(checkout).resolve())
        # What the worker prints besides its answers (torch's profiler announces each start on stderr, "USDT: ...")
        # goes to a file, not between the driver's result lines; it is named at the end, and shown if it fails.
        self.stderr = tempfile.NamedTemporaryFile("w+", prefix=f"bench-worker-{label or 'this'}-", suffix=".log",
                                                  delete=False)
        self.proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=child_env)
        self.info = self._read("READY")
        self.times: list[float] = []

    def _read(self, tag: str):
        for line in self.proc.stdout:
            if line.startswith(f"{tag} "):
                return json.loads(line[len(tag) + 1:])
        said = Path(self.stderr.name).read_text()[-3000:]
        raise RuntimeError(f"benchmark worker {self.label} ended (rc {self.proc.wait()}) before {tag}; its stderr "
                           f"({self.stderr.name}) ends:\n{said}")

    def step(self) -> None:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        self.times.append(self._read("TIME"))

    def finish(self) -> dict:
        """The worker's closing result (its own measurements); ends the process."""
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        result = self._read("RESULT")
        self.proc.wait()
        lines = Path(self.stderr.name).read_text().splitlines()
        if lines:
            print(f"benchmark worker {self.label or 'this checkout'}: {len(lines)} line(s) of its stderr in "
                  f"{self.stderr.name}", file=sys.stderr, flush=True)
        else:
            os.unlink(self.stderr.name)
        return result

    def median(self, key: str | None = None) -> float:
        """Median seconds of the steps (of entry `key` when each step timed several things)."""
        return statistics.median(t if key is None else t[key] for t in self.times)


def interleave(workers: list[Worker], repeats: int) -> None:
    """repeats rounds, each one step of every worker in turn."""
    for _ in range(repeats):
        for worker in workers:
            worker.step()


def serve(info: dict, step: Callable[[], object], result: Callable[[], dict]) -> None:
    """The worker's side: announce `info`, then answer each `step` line with step()'s timing (seconds, or
    a JSON object of them; `step` times itself, so it may leave its set-up out), and `done` with result()."""
    _say("READY", info)
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            _say("TIME", step())
        elif command == "done":
            _say("RESULT", result())
            return


def timed(fn: Callable[[], object], sync: Callable[[], None] = lambda: None) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _say(tag: str, value) -> None:
    print(f"{tag} {json.dumps(value)}", flush=True)
