"""`widenet_ds.engine.lamb.Lamb` multi-tensor (`foreach=True`, the default) against its per-tensor loop
(`foreach=False`, the code before issue 12) and, on CUDA, DeepSpeed's fused `Lamb` kernel.

Every optimizer gets the same parameters (a model's tensors, shapes and values) and the same gradients;
the update of the first step is compared tensor by tensor (max |difference| over max |update|), then each
optimizer's step is timed (median after warm-up). Two layouts: whole tensors (ZeRO stage 0), and the
same tensors packed into one flat fp32 partition with a per-tensor layout (what ZeRO 1/2 hands `Lamb`
after `enable_per_tensor_trust_ratio`). The fused kernel only takes whole tensors here (under ZeRO it
would compute a per-partition trust ratio, see docs/optimizer.md).

    python bench/bench_lamb.py --preset widenet-base-e4                            # GPU: + FusedLamb
    python bench/bench_lamb.py --preset widenet-tiny-e4 --warmup 2 --repeats 5     # CPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import device, init_single_rank, machine, median_seconds  # noqa: E402


def _flat_partition(tensors: list[torch.Tensor]):
    """The tensors packed into one flat parameter (16-element padding between them, as ZeRO aligns) and
    its layout."""
    from widenet_ds.engine.lamb import PartitionLayout, TensorSegment
    pieces, segments, offset = [], [], 0
    for i, t in enumerate(tensors):
        segments.append(TensorSegment(i, offset, t.numel()))
        pad = -t.numel() % 16
        pieces += [t.reshape(-1), t.new_zeros(pad)]
        offset += t.numel() + pad
    flat = torch.nn.Parameter(torch.cat(pieces))
    return flat, PartitionLayout(flat, tuple(segments), len(tensors), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="widenet-base-e4")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from widenet_ds.engine.lamb import Lamb
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    init_single_rank()
    dev = device()
    torch.manual_seed(0)
    model = WideNetForPreTraining(ModelConfig.from_preset(args.preset))
    values = [p.detach().float().to(dev) for p in model.parameters()]
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    gen = torch.Generator(device=dev).manual_seed(1)
    grads = [torch.randn(v.shape, device=dev, generator=gen) * 1e-3 for v in values]

    def whole(make):
        params = [torch.nn.Parameter(v.clone()) for v in values]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        return params, make(params)

    def partition(foreach: bool):
        flat, layout = _flat_partition(values)
        flat.grad = _flat_partition(grads)[0].detach()
        opt = Lamb([flat], foreach=foreach, **hyper)
        opt.set_partition_layouts([layout])
        return [flat], opt

    runs = {"per-tensor loop (before)": whole(lambda ps: Lamb(ps, foreach=False, **hyper)),
            "multi-tensor (foreach)": whole(lambda ps: Lamb(ps, **hyper)),
            "ZeRO partition, loop": partition(False),
            "ZeRO partition, foreach": partition(True)}
    if dev.type == "cuda":
        from deepspeed.ops.lamb import FusedLamb
        runs = {"deepspeed FusedLamb (CUDA)": whole(lambda ps: FusedLamb(ps, **hyper)), **runs}
    before = [v.clone() for v in values]
    reference = "deepspeed FusedLamb (CUDA)" if dev.type == "cuda" else "per-tensor loop (before)"
    for params, opt in runs.values():
        opt.step()
    ref_params = runs[reference][0]
    worst = {}
    for name, (params, _) in runs.items():
        after = params if len(params) > 1 else [params[0][s.start:s.start + s.numel].view_as(v) for s, v in
                                                zip(_flat_partition(values)[1].segments, values)]
        worst[name] = max(((a - r).abs().max() / (r - b).abs().max().clamp(min=1e-30)).item()
                          for a, r, b in zip(after, ref_params, before))
    seconds = {name: median_seconds(opt.step, args.warmup, args.repeats) for name, (_, opt) in runs.items()}
    n = sum(v.numel() for v in values)
    print(f"\n# LAMB step: {machine()}; {args.preset} parameters ({n:,} in {len(values)} tensors), fp32")
    print(f"{'optimizer':<30}{'step ms':>10}{'first-step diff vs ' + reference:>52}")
    for name in runs:
        print(f"{name:<30}{seconds[name] * 1e3:>10.3f}{worst[name]:>52.2e}")
    print("\nratios (step time)")
    print(f"  loop / foreach, whole tensors = {seconds['per-tensor loop (before)'] / seconds['multi-tensor (foreach)']:.2f}")
    print(f"  loop / foreach, ZeRO partition = {seconds['ZeRO partition, loop'] / seconds['ZeRO partition, foreach']:.2f}")
    if dev.type == "cuda":
        fused = seconds["deepspeed FusedLamb (CUDA)"]
        print(f"  foreach / FusedLamb = {seconds['multi-tensor (foreach)'] / fused:.2f} (target <= 1.5)")
        print(f"  ZeRO partition foreach / FusedLamb = {seconds['ZeRO partition, foreach'] / fused:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
