"""Where a training step's time goes beyond its FLOPs: forward + backward and the optimizer step, timed apart.

The FLOP-ideal speed of bench_train_step.py counts the tokens' FLOPs only. Two costs grow with the expert
parameters instead: the optimizer step (LAMB reads and writes every parameter and its two moments) and,
because WideNet's one MoE layer is called by every block, the sum of its experts' gradients over the D
calls. widenet-base-e8 has the FLOPs of -e4 and twice its expert parameters; this shows how much of its step
those two costs take. Models take turns (A B C A B C ...) in one process; no DeepSpeed engine (the model and
our LAMB only).

    python bench/step_parts.py --models albert-base widenet-base-e4 widenet-base-e8 --batch 8 --seq 128

`--memory` adds each part's peak: the most bytes torch's CPU allocator held above the part's start, from the
profiler's allocation records of one more step (exact and the same from run to run, unlike a process's max
RSS, which moves in ~110 MiB steps between identical runs under tcmalloc). The forward + backward starts
with no gradients (it allocates them), the optimizer step with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_train_step import MODELS, _batch, _build  # noqa: E402
from bench.common import init_single_rank, machine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["albert-base", "widenet-base-e4", "widenet-base-e8"],
                        choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model after one warm-up step")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--memory", action="store_true", help="also each part's peak allocator bytes (CPU)")
    args = parser.parse_args()

    from widenet_ds.engine.lamb import Lamb, build_param_groups
    init_single_rank()
    torch.set_num_threads(args.threads)
    runs = {}
    for name in args.models:
        torch.manual_seed(0)
        cfg, model, kwargs = _build(name, compile_model=False)
        model.train()
        optimizer = Lamb(build_param_groups(model, weight_decay=0.01), lr=1e-4, weight_decay=0.01)
        runs[name] = (model, kwargs(_batch(cfg.vocab_size, args.batch, args.seq, torch.device("cpu"))), optimizer)
    times = {name: ([], []) for name in runs}
    for repeat in range(args.repeats + 1):
        for name, (model, batch, optimizer) in runs.items():
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            model(**batch).loss.backward()
            middle = time.perf_counter()
            optimizer.step()
            end = time.perf_counter()
            if repeat:  # the first step warms up (allocations, the optimizer's state)
                times[name][0].append(middle - start)
                times[name][1].append(end - middle)

    print(f"# {machine()}, {args.threads} threads, fp32, batch {args.batch} x {args.seq}, median of "
          f"{args.repeats} interleaved steps, {time.strftime('%Y-%m-%d %H:%M')}")
    peaks = {name: _peaks_mib(*run) for name, run in runs.items()} if args.memory else {}
    print(f"{'model':<26}{'params M':>9}{'fwd+bwd s':>11}{'optimizer s':>13}{'step s':>8}"
          + (f"{'fwd+bwd peak MiB':>18}{'optimizer peak MiB':>20}" if peaks else ""))
    for name, (model, _, _) in runs.items():
        forward_backward, step = (statistics.median(t) for t in times[name])
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{name:<26}{params:>9.1f}{forward_backward:>11.2f}{step:>13.2f}{forward_backward + step:>8.2f}"
              + (f"{peaks[name][0]:>18.0f}{peaks[name][1]:>20.0f}" if peaks else ""))
    return 0


def _peaks_mib(model, batch, optimizer) -> tuple[float, float]:
    """Peak allocator MiB above the start of a forward + backward and of an optimizer step (one more step)."""
    optimizer.zero_grad(set_to_none=True)
    forward_backward = _peak_mib(lambda: model(**batch).loss.backward())
    return forward_backward, _peak_mib(optimizer.step)


def _peak_mib(fn) -> float:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # "[memory]" records: +bytes on allocation, -bytes on free, in time order
    records = sorted(((r.start_ns(), r.nbytes()) for r in prof.profiler.kineto_results.events()
                      if r.name() == "[memory]"), key=lambda record: record[0])
    held = peak = 0
    for _, nbytes in records:
        held += nbytes
        peak = max(peak, held)
    return peak / 2**20


if __name__ == "__main__":
    sys.exit(main())
