"""Token routing of the shared MoE: top-k choice, capacity, balance loss and routing statistics.

`route_tokens` turns router logits into a `Routing` (DeepSpeed's sparse-route layout: [k, T] per field)
that the MoE layer dispatches with; it is a plain function of the logits so that routing groups can reuse
one call's decisions and the tests can compare it with DeepSpeed's `top2gating` exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn.functional as F
from deepspeed.moe.sharded_moe import gumbel_rsample
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


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """B = ceil(K * C * T / E) in exact arithmetic, so float rounding never adds or removes a slot."""
    return math.ceil(Fraction(k * num_tokens) * Fraction(str(capacity_factor)) / num_experts)


def _cumsum_over_tokens(mask: Tensor) -> Tensor:
    """cumsum(mask, dim=0) for mask [T, E], scanned along the contiguous dim: on GPU the outer-dim scan
    of a [T, E] with few experts runs nearly serially (1.3 ms at T = 8192, E = 4 on an H100, over 40% of a
    WideNet training step's GPU time); the transposed scan is parallel."""
    return torch.cumsum(mask.t().contiguous(), dim=1).t()


def route_tokens(logits: Tensor, cfg: MoEConfig, *, training: bool,
                 ep_group: torch.distributed.ProcessGroup | None = None) -> Routing:
    """Top-k routing with capacity (paper eq. 1-5, 8; GShard-style slot assignment as DeepSpeed's).

    logits: fp32 [T, E] router outputs f(x). Choice j of every token is placed after all choices < j
    (DeepSpeed's order), so with k = 2, C and drop rules equal, this is DeepSpeed's `top2gating`.
    """
    num_tokens, num_experts = logits.shape
    k = cfg.top_k
    if training and cfg.noise == "gaussian":
        # Paper: g(x) = TopK(softmax(f(x) + eps)), eps ~ N(0, 1/E^2).
        logits = logits + torch.randn_like(logits) / num_experts
    probs = F.softmax(logits, dim=1)

    first_scores = probs
    if training and cfg.noise == "rsample":
        first_scores = logits + gumbel_rsample(logits.shape, device=logits.device)
    later_scores = logits
    if training and cfg.second_expert_sampling:
        later_scores = logits + gumbel_rsample(logits.shape, device=logits.device)

    masks, indices = [], []
    taken = torch.zeros_like(probs, dtype=torch.bool)
    for choice in range(k):
        scores = first_scores if choice == 0 else later_scores.masked_fill(taken, float("-inf"))
        index = torch.argmax(scores, dim=1)
        mask = F.one_hot(index, num_classes=num_experts)
        taken |= mask.bool()
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
        capacity = _capacity(cfg, num_tokens, expert_counts, training, ep_group)
        kept = [mask * torch.lt(loc, capacity) for mask, loc in zip(masks, locations)]

    weights = torch.stack([(probs * mask.float()).sum(dim=1) for mask in kept])
    if cfg.combine_weights == "renormalize":
        weights = weights / torch.clamp(weights.sum(dim=0, keepdim=True), min=torch.finfo(weights.dtype).eps)
    expert_index = torch.stack([torch.where(mask.any(dim=1), index, torch.full_like(index, -1))
                                for mask, index in zip(kept, indices)]).to(torch.int32)
    location = torch.stack([(loc * mask).sum(dim=1) for loc, mask in zip(locations, kept)]).to(torch.int32)
    dropped = (num_tokens * k - sum(mask.sum() for mask in kept)).detach()
    return Routing(balance_loss, capacity, expert_index, location, weights, expert_counts, dropped)


def _capacity(cfg: MoEConfig, num_tokens: int, expert_counts: Tensor, training: bool,
              ep_group: torch.distributed.ProcessGroup | None) -> int:
    if cfg.drop_tokens:
        factor = cfg.capacity_factor if training else cfg.eval_capacity_factor
        return max(expert_capacity(num_tokens, len(expert_counts), cfg.top_k, factor), cfg.min_capacity)
    # No dropping: every expert's buffer holds its busiest rank's load.
    busiest = expert_counts.max().clone()
    if ep_group is not None and torch.distributed.get_world_size(ep_group) > 1:
        torch.distributed.all_reduce(busiest, op=torch.distributed.ReduceOp.MAX, group=ep_group)
    return int(busiest)
