"""Token routing of the shared MoE: top-k choice, capacity, balance loss and routing statistics.

`route_tokens` turns router logits into a `Routing` (DeepSpeed's sparse-route layout: [k, T] per field)
that the MoE layer dispatches with; it is a plain function of the logits so that routing groups can reuse
one call's decisions and the tests can compare it with DeepSpeed's `top2gating` exactly.

It never synchronises with the host: every size (the capacity included) follows from the logits' shape
and the config, never from their values, so `torch.compile(route_tokens, fullgraph=True)` traces it whole
and a GPU never waits for the CPU to read a routing decision (tests/runtime/test_compile.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor

from widenet_ds.model.config import MoEConfig


@dataclass
class Routing:
    """One routing call's decisions, in DeepSpeed's sparse-route layout ([k, tokens] per field)."""

    balance_loss: Tensor      # scalar, differentiable w.r.t. the router
    capacity: int             # slots per expert on this rank; 0 = unbounded (dropless dispatch)
    expert_index: Tensor      # int32 [k, T], -1 where the route overflowed its expert and was dropped
    location: Tensor          # int32 [k, T], slot inside the expert's buffer
    weight: Tensor            # float [k, T], combine weight of each route
    expert_counts: Tensor     # int [E], routes assigned to each expert before capacity dropping
    dropped_routes: Tensor    # int scalar, routes dropped by capacity


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float,
                    rounding: str = "ceil") -> int:
    """B = ceil(K * C * T / E) (or floor: the authors' vision code, int(T * C * K // E)) in exact arithmetic,
    so float rounding never adds or removes a slot.

    Integer operations only on `num_tokens`, so that a symbolic token count under torch.compile stays
    symbolic (a `Fraction` of a SymInt would not trace)."""
    num, den = Fraction(str(capacity_factor)).as_integer_ratio()
    if rounding == "floor":
        return (k * num_tokens * num) // (den * num_experts)
    return -(-(k * num_tokens * num) // (den * num_experts))


def gumbel_noise(shape: torch.Size, device: torch.device) -> Tensor:
    """Gumbel(0, 1) samples, the same numbers as DeepSpeed's `gumbel_rsample` for the same RNG state
    (its `torch.distributions.Gumbel`, written out: -log(-log(u)), u uniform in [tiny, 1 - eps)) without
    its per-device cache of distribution objects, which torch.compile cannot trace."""
    info = torch.finfo(torch.float32)
    low = torch.tensor(info.tiny, device=device)
    high = torch.tensor(1.0 - info.eps, device=device)
    uniform = low + torch.rand(shape, device=device) * (high - low)
    return -torch.log(-torch.log(uniform))


def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
    """x * U(1 - epsilon, 1 + epsilon): DeepSpeed's `multiplicative_jitter` (same numbers for the same RNG
    state), traceable by torch.compile."""
    low = torch.tensor(1.0 - epsilon, device=x.device)
    high = torch.tensor(1.0 + epsilon, device=x.device)
    return x * (low + torch.rand(x.shape, device=x.device) * (high - low))


def _cumsum_over_tokens(mask: Tensor) -> Tensor:
    """cumsum(mask, dim=0) for mask [T, E], scanned along the contiguous dim: on GPU the outer-dim scan
    of a [T, E] with few experts runs nearly serially (1.3 ms at T = 8192, E = 4 on an H100, over 40% of a
    WideNet training step's GPU time); the transposed scan is parallel."""
    return torch.cumsum(mask.t().contiguous(), dim=1).t()


def route_tokens(logits: Tensor, cfg: MoEConfig, *, training: bool) -> Routing:
    """Top-k routing with capacity (paper eq. 1-5, 8; GShard-style slot assignment as DeepSpeed's).

    logits: fp32 [T, E] router outputs f(x). Choice j of every token is placed after all choices < j
    (DeepSpeed's order), so with k = 2, C and drop rules equal, this is DeepSpeed's `top2gating`.
    Sync-free (no `.item()`, no size read from a tensor), see the module docstring.
    """
    num_tokens, num_experts = logits.shape
    k = cfg.top_k
    if training and cfg.noise == "gaussian":
        # Paper: g(x) = TopK(softmax(f(x) + eps)), eps ~ N(0, 1/E^2).
        logits = logits + torch.randn_like(logits) / num_experts
    probs = F.softmax(logits, dim=1)

    first_scores = probs
    if training and cfg.noise == "rsample":
        first_scores = logits + gumbel_noise(logits.shape, logits.device)
    later_scores = logits
    if training and cfg.second_expert_sampling:
        later_scores = logits + gumbel_noise(logits.shape, logits.device)

    masks, indices = [], []
    taken = torch.zeros_like(probs, dtype=torch.bool)
    experts = torch.arange(num_experts, device=logits.device)
    for choice in range(k):
        scores = first_scores if choice == 0 else later_scores.masked_fill(taken, float("-inf"))
        index = torch.argmax(scores, dim=1)
        # one_hot(index) without one_hot's range check, which reads the indices on the host on CPU.
        hit = index.unsqueeze(1) == experts
        mask = hit.long()
        taken |= hit
        masks.append(mask)
        indices.append(index)

    # Slots: choice j of a token goes after every choice < j of all tokens (DeepSpeed's top2 order).
    locations, offset = [], torch.zeros(num_experts, dtype=masks[0].dtype, device=logits.device)
    for mask in masks:
        locations.append(_cumsum_over_tokens(mask) - 1 + offset)
        offset = offset + mask.sum(dim=0)

    mean_prob = probs.mean(dim=0)
    if cfg.balance_loss == "switch":
        # l = E * sum_i m_i P_i with m_i the fraction of tokens whose top-1 is expert i.
        routed_fraction = masks[0].float().mean(dim=0)
    else:
        # The authors' TF code: both choices counted, divided by k.
        routed_fraction = torch.stack(masks).float().sum(dim=0).mean(dim=0) / k
    balance_loss = num_experts * torch.sum(mean_prob * routed_fraction)

    expert_counts = torch.stack(masks).sum(dim=(0, 1)).detach()
    if cfg.dispatch == "dropless":
        # Every route runs on its expert: no capacity to compute, no route to drop.
        capacity, kept = 0, masks
    else:
        capacity = _capacity(cfg, num_tokens, num_experts, training)
        kept = [mask * torch.lt(loc, capacity) for mask, loc in zip(masks, locations)]

    weights = torch.stack([(probs * mask.float()).sum(dim=1) for mask in kept])
    if cfg.combine_weights == "renormalize":
        weights = weights / torch.clamp(weights.sum(dim=0, keepdim=True), min=torch.finfo(weights.dtype).eps)
    expert_index = torch.stack([torch.where(mask.any(dim=1), index, torch.full_like(index, -1))
                                for mask, index in zip(kept, indices)]).to(torch.int32)
    location = torch.stack([(loc * mask).sum(dim=1) for loc, mask in zip(locations, kept)]).to(torch.int32)
    dropped = (num_tokens * k - sum(mask.sum() for mask in kept)).detach()
    return Routing(balance_loss, capacity, expert_index, location, weights, expert_counts, dropped)


def _capacity(cfg: MoEConfig, num_tokens: int, num_experts: int, training: bool) -> int:
    if cfg.drop_tokens:
        factor = cfg.capacity_factor if training else cfg.eval_capacity_factor
        return torch.sym_max(expert_capacity(num_tokens, num_experts, cfg.top_k, factor,
                                             cfg.capacity_rounding), cfg.min_capacity)
    # No dropping: a static bound instead of the busiest expert's load (reading that load is a
    # device -> host sync, plus an all-reduce over the expert-parallel group). The k choices of a token are
    # distinct experts, so an expert receives at most one route per token: T slots always suffice, on every
    # rank alike (the all-to-all already needs the same T everywhere). The price is E * T buffer rows for
    # K * T routes; `dispatch = "dropless"` keeps every route without that padding.
    return num_tokens
