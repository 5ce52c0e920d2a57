"""Profile training steps of one model (torch.profiler): the top operators by device (or CPU) time.

    python bench/profile_step.py widenet-base-e4-dropless --batch 64 --dtype bf16
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_train_step import MODELS, _batch, _build, _engine  # noqa: E402
from bench.common import init_single_rank, machine, sync  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--optimizer", choices=("fused-lamb", "torch-lamb"),
                        default="fused-lamb" if torch.cuda.is_available() else "torch-lamb")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    init_single_rank()
    torch.manual_seed(0)
    cfg, model, kwargs = _build(args.model, compile_model=False)
    engine = _engine(model, args.dtype, args.batch, args.optimizer)
    batch = kwargs(_batch(cfg.vocab_size, args.batch, args.seq, engine.device))

    def step():
        engine.backward(engine(**batch).loss)
        engine.step()

    for _ in range(3):
        step()
    sync()
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\n# Profile of {args.steps} steps: {args.model}, {args.dtype}, batch {args.batch} x {args.seq}; {machine()}")
    print(prof.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
