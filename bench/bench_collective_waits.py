"""The longest time a healthy run's ranks wait in one collective: what `--init-timeout` and `--train-timeout` must
exceed (distributed/collective_timeouts.py; the numbers are in docs/cluster.md, "Faults: bounded waits").

    .venv/bin/python bench/bench_collective_waits.py -- pretrain --num-ranks 2 -- --model-config ... (launch args)

runs `widenet-ds launch` with those arguments; every rank times each `torch.distributed` call it makes (a
`sitecustomize` on the ranks' PYTHONPATH wraps the module's collectives; calls inside them are not counted twice)
and, at exit, writes them out. Printed: per phase (start-up: before the first step's agreement; training: after
it), the longest waits, the collective, the rank and the caller in widenet_ds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "gather_object", "scatter")

SITECUSTOMIZE = '''
import atexit, functools, json, os, sys, time
if b"widenet_ds.train" in open("/proc/self/cmdline", "rb").read():  # the ranks (not the launchers)
    import torch.distributed as _dist
    _calls, _depth = [], [0]

    def _caller():
        frame = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            if "widenet_ds" in path:
                return f"{path.split('widenet_ds', 1)[1].lstrip('/')}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def _wrap(name, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if _depth[0]:
                return function(*args, **kwargs)
            _depth[0] += 1
            start = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                _depth[0] -= 1
                phase = "start-up"
                bounds = sys.modules.get("widenet_ds.distributed.collective_timeouts")
                if bounds is not None and bounds._BOUNDS.flag == "--train-timeout":
                    phase = "training"
                _calls.append((name, phase, time.monotonic() - start, _caller()))
        return timed

    for _name in NAMES:
        if hasattr(_dist, _name):
            setattr(_dist, _name, _wrap(_name, getattr(_dist, _name)))

    @atexit.register
    def _write():
        rank = os.environ.get("RANK", "?")
        with open(os.path.join(os.environ["WIDENET_WAITS_DIR"], f"rank{rank}-{os.getpid()}.json"), "w") as out:
            json.dump({"rank": rank, "calls": _calls}, out)
'''


def longest(folder: Path, top: int) -> dict[str, list[tuple[float, str, str, str]]]:
    by_phase: dict[str, list[tuple[float, str, str, str]]] = {}
    for path in folder.glob("rank*.json"):
        record = json.loads(path.read_text())
        for name, phase, seconds, caller in record["calls"]:
            by_phase.setdefault(phase, []).append((seconds, name, record["rank"], caller))
    return {phase: sorted(calls, reverse=True)[:top] for phase, calls in by_phase.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("launch", nargs=argparse.REMAINDER, help="`widenet-ds launch` arguments after `--`")
    args = parser.parse_args()
    launch = args.launch[1:] if args.launch[:1] == ["--"] else args.launch
    with tempfile.TemporaryDirectory(prefix="widenet-waits-") as folder:
        site, waits = Path(folder) / "site", Path(folder) / "waits"
        site.mkdir()
        waits.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("NAMES", repr(COLLECTIVES)))
        env = {**os.environ, "WIDENET_WAITS_DIR": str(waits),
               "PYTHONPATH": os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)}
        code = subprocess.call([sys.executable, "-m", "widenet_ds.cli", "launch", *launch], env=env, cwd=REPO)
        for phase, calls in longest(waits, args.top).items():
            print(f"{phase}: the {len(calls)} longest waits in one collective")
            for seconds, name, rank, caller in calls:
                print(f"  {seconds:8.2f} s  {name:<22} rank {rank:<3} {caller}")
    return code


if __name__ == "__main__":
    sys.exit(main())
