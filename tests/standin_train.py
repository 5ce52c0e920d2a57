"""A few-second stand-in for a training entrypoint, for launcher tests that are about ranks, signals
and requeue rather than the model: the same flags and outputs as pretrain/run_pretrain.py.

Each step all-reduces (rank + 1) * step over the real process group (initialised through
widenet_ds.distributed, so the launch-environment resolver is what is tested), rank 0 appends
`{"step", "loss", "world_size", "source"}` to <output-dir>/metrics.jsonl and saves a checkpoint every
--save-interval steps under <output-dir>/checkpoints/step_<N>/. SIGTERM/SIGUSR1 -> checkpoint the
current step and exit 0, the contract the Slurm scripts rely on.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from widenet_ds.distributed import init_distributed
from widenet_ds.launch_env import resolve_launch_env


def latest_step(checkpoints: Path) -> int:
    steps = [int(p.name.split("_")[1]) for p in checkpoints.glob("step_*") if (p / "state.json").exists()]
    return max(steps, default=0)


def save(checkpoints: Path, step: int) -> None:
    target = checkpoints / f"step_{step}"
    tmp = checkpoints / f".step_{step}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    os.replace(tmp, target)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", required=True)
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-interval", type=int, default=1000)
    parser.add_argument("--resume", nargs="?", const="latest", default=None)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--local_rank", type=int, default=None)
    args = parser.parse_args()

    stop = {"signal": 0}
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, lambda s, _f: stop.update(signal=int(s)))

    launch = resolve_launch_env()
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoints = args.output_dir / "checkpoints"
    start = latest_step(checkpoints) if args.resume else 0
    if rank == 0:
        checkpoints.mkdir(parents=True, exist_ok=True)
        print(f"standin: rank 0 of {world} via {launch.source}, starting after step {start}", flush=True)
    for step in range(start + 1, args.max_steps + 1):
        time.sleep(args.step_seconds)
        value = torch.tensor([float((rank + 1) * step)])
        dist.all_reduce(value)
        # Every rank must stop at the same step: agree on "a signal arrived somewhere".
        stop_flag = torch.tensor([stop["signal"]], dtype=torch.int64)
        dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(args.output_dir / "metrics.jsonl", "a") as out:
                out.write(json.dumps({"step": step, "loss": value.item(), "world_size": world,
                                      "source": launch.source}) + "\n")
            if step % args.save_interval == 0 or step == args.max_steps or stop_flag.item():
                save(checkpoints, step)
        if stop_flag.item():
            dist.barrier()
            if rank == 0:
                print(f"standin: signal {stop_flag.item()} -> checkpoint at step {step}, exiting", flush=True)
            return 0
    dist.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
