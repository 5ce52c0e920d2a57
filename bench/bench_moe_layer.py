"""MoE layer breakdown -- gate, dispatch, experts, combine -- at several token counts, four ways:

* `deepspeed-stock`: DeepSpeed's `MoE` module as shipped (its TopKGate with Gumbel 2nd-expert sampling,
  then DeepSpeed 0.19's index-based `_sparse_encode` / `_sparse_decode` into [E, B, M] capacity buffers);
* `deepspeed-onehot`: the same gate without `sparse_routes`, dispatch and combine as the dense one-hot
  einsums "sec,sm->ecm" / "sec,ecm->sm" (older DeepSpeed's MOELayer);
* `widenet-capacity`: our `SharedMOELayer` with `dispatch = "deepspeed"` (our gate, DeepSpeed's buffers);
* `widenet-dropless`: our layer with `dispatch = "dropless"` (expert-sorted rows, no capacity, grouped GEMM).

The `limit` column is the grouped-GEMM expert-only time: the same experts' FFN (`grouped_expert_ffn`:
`torch._grouped_mm` on CUDA bf16) on the dropless path's expert-sorted rows of the same routes, fwd+bwd,
nothing else; `x limit` = the layer's fwd+bwd / that (issue 12 target: <= 1.5 at 8k tokens on a GPU).
`--compile` adds the same rows with the layers under torch.compile (fullgraph).

Phases are timed apart in forward (no autograd), each the median of repeats after warm-up; `fwd+bwd` is
the whole layer's forward and backward. Routing share = (gate + dispatch + combine) / sum of phases.
H 768, F 3072 (the base presets' expert), K 2, C 1.2.

    python bench/bench_moe_layer.py --tokens 2048 8192 --experts 4 --repeats 3            # CPU
    python bench/bench_moe_layer.py --tokens 2048 8192 32768 --experts 4 8 --dtype bf16 --compile  # GPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import device, init_single_rank, machine, median_seconds  # noqa: E402

PATHS = ("deepspeed-stock", "deepspeed-onehot", "widenet-capacity", "widenet-dropless")
PHASES = ("gate", "dispatch", "experts", "combine")


def _layers(experts: int, dtype: torch.dtype, dev: torch.device):
    from deepspeed.moe.layer import MoE

    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.moe import FeedForward, MoEFeedForward
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("widenet-base-e4", moe={"num_experts": experts})
    stock = MoE(cfg.hidden_size, FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.activation),
                num_experts=experts, k=2, capacity_factor=1.2, min_capacity=4, drop_tokens=True)
    stock.set_deepspeed_parallelism()
    ours = {}
    for dispatch in ("deepspeed", "dropless"):
        layer = MoEFeedForward(ModelConfig.from_preset("widenet-base-e4",
                                                       moe={"num_experts": experts, "dispatch": dispatch}))
        layer.ensure_process_groups()
        if ours:  # the same router and experts on both dispatches
            layer.load_state_dict(ours["deepspeed"].state_dict())
        ours[dispatch] = layer
    return [m.to(device=dev, dtype=dtype).train() for m in (stock, ours["deepspeed"], ours["dropless"])]


def _phases(path: str, stock, capacity_layer, dropless_layer, x: torch.Tensor, warmup: int, repeats: int):
    """Median seconds of each phase of `path` on tokens x [T, M], forward only."""
    from deepspeed.moe.sharded_moe import _route_slots, _sparse_decode, _sparse_encode, top2gating

    from widenet_ds.model.dropless import sorted_route_order
    from widenet_ds.model.grouped_experts import (ExpertWeights, batched_expert_ffn, group_alignment,
                                                  grouped_expert_ffn)
    T, M = x.shape
    time = lambda fn: median_seconds(fn, warmup, repeats)  # noqa: E731
    if path in ("deepspeed-stock", "deepspeed-onehot"):
        layer = stock.deepspeed_moe
        E = layer.num_local_experts
        if path == "deepspeed-stock":
            gate = lambda: layer.gate(x, None, True)  # noqa: E731
            _, C, _, idx, loc, gates, _ = gate()
            C = int(C)
            slots = _route_slots(idx, loc, E, C)
            dispatch = lambda: _sparse_encode(x, _route_slots(idx, loc, E, C), E, C)  # noqa: E731
            buffer = dispatch()
            out = layer.experts(buffer.reshape(1, E, C, M)).reshape(E * C, M)
            combine = lambda: _sparse_decode(out, slots, gates, T)  # noqa: E731
        else:
            def gate():
                logits = torch.nn.functional.linear(x.float(), layer.gate.wg.weight.float())
                return top2gating(logits, 1.2, 4, drop_tokens=True, top2_2nd_expert_sampling=True)
            _, combine_weights, dispatch_mask, _ = gate()
            dispatch = lambda: torch.einsum("sec,sm->ecm", dispatch_mask.type_as(x), x)  # noqa: E731
            buffer = dispatch()
            C = buffer.shape[1]
            out = layer.experts(buffer.reshape(1, E, C, M)).reshape(E, C, M)
            combine = lambda: torch.einsum("sec,ecm->sm", combine_weights.type_as(x), out)  # noqa: E731
        experts = lambda: layer.experts(buffer.reshape(1, E, C, M))  # noqa: E731
    elif path == "widenet-capacity":
        layer = capacity_layer.moe.deepspeed_moe
        E = layer.num_local_experts
        gate = lambda: layer.gate(x)  # noqa: E731
        routing = gate()
        C = routing.capacity
        weights = ExpertWeights.stack(layer.experts.deepspeed_experts)
        slots = _route_slots(routing.expert_index, routing.location, E, C)
        dispatch = lambda: _sparse_encode(x, _route_slots(routing.expert_index, routing.location, E, C), E, C)  # noqa: E731
        buffer = dispatch()
        experts = lambda: batched_expert_ffn(buffer, ExpertWeights.stack(layer.experts.deepspeed_experts))  # noqa: E731
        out = experts().reshape(E * C, M)
        combine = lambda: _sparse_decode(out, slots, routing.weight, T)  # noqa: E731
    else:
        layer = dropless_layer.moe.deepspeed_moe
        gate = lambda: layer.gate(x)  # noqa: E731
        routing = gate()
        align = group_alignment(x.device)

        def dispatch():
            row_of_route, route_of_row, ends = sorted_route_order(routing, align)
            token_of_row = torch.where(route_of_row < 2 * T, route_of_row % T, T)
            rows = torch.cat([x, x.new_zeros(1, M)]).index_select(0, token_of_row)
            return row_of_route, ends, rows
        row_of_route, ends, rows = dispatch()
        experts = lambda: grouped_expert_ffn(rows, ends, ExpertWeights.stack(layer.experts.deepspeed_experts))  # noqa: E731
        out = experts()

        def combine():
            per_route = out.index_select(0, row_of_route.reshape(-1)).view(2, T, M)
            return (per_route.float() * routing.weight.unsqueeze(-1)).sum(dim=0).to(x.dtype)
    with torch.no_grad():
        return {"gate": time(gate), "dispatch": time(dispatch), "experts": time(experts), "combine": time(combine)}


def _fwd_bwd(module, x: torch.Tensor, warmup: int, repeats: int) -> float:
    def step():
        inp = x.detach().requires_grad_(True)
        out = module(inp)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return median_seconds(step, warmup, repeats)


def _grouped_limit(dropless_layer, x: torch.Tensor, warmup: int, repeats: int) -> float:
    """fwd+bwd of the experts alone as one grouped GEMM on the dropless layout of the same routes."""
    from widenet_ds.model.dropless import sorted_route_order
    from widenet_ds.model.grouped_experts import ExpertWeights, group_alignment, grouped_expert_ffn
    layer = dropless_layer.moe.deepspeed_moe
    with torch.no_grad():
        routing = layer.gate(x)
    _, route_of_row, ends = sorted_route_order(routing, group_alignment(x.device))
    T = x.shape[0]
    rows = torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, torch.where(route_of_row < 2 * T,
                                                                                   route_of_row % T, T))

    def step():
        inp = rows.detach().requires_grad_(True)
        grouped_expert_ffn(inp, ends, ExpertWeights.stack(layer.experts.deepspeed_experts)).float().sum().backward()
    return median_seconds(step, warmup, repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--experts", type=int, nargs="+", default=[4])
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time the layers under torch.compile")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    args = parser.parse_args()
    init_single_rank()
    dev, dtype = device(), {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    print(f"\n# MoE layer breakdown: {machine()}; {args.dtype}; H 768, F 3072, K 2, C 1.2; ms, median of "
          f"{args.repeats} after {args.warmup} warm-up (phases forward-only; fwd+bwd whole layer)")
    print(f"{'E':>3}{'tokens':>8} {'path':<27}" + "".join(f"{p:>10}" for p in PHASES)
          + f"{'sum':>10}{'routing %':>10}{'fwd+bwd':>10}{'limit':>10}{'x limit':>10}")
    summary = []
    for experts in args.experts:
        stock, capacity_layer, dropless_layer = _layers(experts, dtype, dev)
        modules = dict(zip(PATHS, (stock, None, capacity_layer, dropless_layer)))
        for tokens in args.tokens:
            x = torch.randn(tokens, 768, device=dev, dtype=dtype)
            rows = {}
            limit = _grouped_limit(dropless_layer, x, args.warmup, args.repeats)
            for path in args.paths:
                phases = _phases(path, stock, capacity_layer, dropless_layer, x, args.warmup, args.repeats)
                total = sum(phases.values())
                share = (total - phases["experts"]) / total
                module = modules[path]
                variants = [("", module)]
                if args.compile and path.startswith("widenet"):
                    variants.append((" compiled", torch.compile(module, fullgraph=True)))
                for suffix, variant in variants:
                    fwd_bwd = (_fwd_bwd(variant, x[None], args.warmup, args.repeats) if variant is not None
                               else float("nan"))
                    rows[path + suffix] = (total, share, fwd_bwd)
                    print(f"{experts:>3}{tokens:>8} {path + suffix:<27}"
                          + "".join(f"{phases[p] * 1e3:>10.2f}" for p in PHASES)
                          + f"{total * 1e3:>10.2f}{share:>10.1%}{fwd_bwd * 1e3:>10.2f}{limit * 1e3:>10.2f}"
                          + f"{fwd_bwd / limit:>10.2f}", flush=True)
            summary.append((experts, tokens, rows))
    print("\nratios (routing share = (gate + dispatch + combine) / layer forward; target <= 10% at 8k tokens)")
    for experts, tokens, rows in summary:
        line = [f"  E {experts} T {tokens}:"]
        if "deepspeed-stock" in rows and "widenet-dropless" in rows:
            line.append(f"forward speed-up of dropless vs stock {rows['deepspeed-stock'][0] / rows['widenet-dropless'][0]:.2f}x;")
        for suffix in ("", " compiled"):
            cap, drop = rows.get("widenet-capacity" + suffix), rows.get("widenet-dropless" + suffix)
            if cap and drop:
                line.append(f"fwd+bwd dropless / capacity speed-up{suffix} {cap[2] / drop[2]:.2f}x;")
        line.append("routing share " + ", ".join(f"{p} {r[1]:.1%}" for p, r in rows.items() if "compiled" not in p))
        print(" ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
