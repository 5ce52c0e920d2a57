"""DeepSpeed's fused CUDA `Lamb` against `widenet_ds.runtime.lamb.Lamb`: one step's update, and time per step.

Both get the same parameters (a model's tensors, shapes and values) and the same gradients; the update
of the first step is compared tensor by tensor (max |difference| over max |update|), then each optimizer's
step is timed (median after warm-up). CUDA only: the fused kernel does not run on CPU.

    python bench/bench_lamb.py --preset widenet-base-e4
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import init_single_rank, machine, median_seconds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="widenet-base-e4")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_lamb.py needs CUDA (DeepSpeed's Lamb is a fused CUDA kernel)", file=sys.stderr)
        return 2
    from deepspeed.ops.lamb import FusedLamb

    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.runtime.lamb import Lamb
    init_single_rank()
    torch.manual_seed(0)
    model = WideNetForPreTraining(ModelConfig.from_preset(args.preset))
    shapes = [p.detach().float() for p in model.parameters()]
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)

    def params():
        return [torch.nn.Parameter(p.clone().cuda()) for p in shapes]

    fused_params, torch_params = params(), params()
    gen = torch.Generator(device="cuda").manual_seed(1)
    grads = [torch.randn(p.shape, device="cuda", generator=gen) * 1e-3 for p in fused_params]
    for ps in (fused_params, torch_params):
        for p, g in zip(ps, grads):
            p.grad = g.clone()
    fused, ours = FusedLamb(fused_params, **hyper), Lamb(torch_params, **hyper)
    before = [p.detach().clone() for p in fused_params]
    fused.step()
    ours.step()
    worst = 0.0
    for b, f, t in zip(before, fused_params, torch_params):
        update = (f - b).abs().max().item()
        worst = max(worst, ((f - t).abs().max().item() / update) if update else 0.0)
    n = sum(p.numel() for p in fused_params)
    fused_s = median_seconds(fused.step, args.warmup, args.repeats)
    ours_s = median_seconds(ours.step, args.warmup, args.repeats)
    print(f"\n# LAMB step: {machine()}; {args.preset} parameters ({n:,} in {len(fused_params)} tensors), fp32")
    print(f"{'optimizer':<28}{'step ms':>10}")
    print(f"{'deepspeed FusedLamb (CUDA)':<28}{fused_s * 1e3:>10.3f}")
    print(f"{'widenet_ds.runtime.lamb.Lamb':<28}{ours_s * 1e3:>10.3f}")
    print(f"\nratios\n  first-step update: max |fused - ours| / max |update| over tensors = {worst:.2e}")
    print(f"  torch Lamb step time / fused = {ours_s / fused_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
