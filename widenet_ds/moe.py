"""The shared Mixture-of-Experts layer, built on DeepSpeed's MoE.

DeepSpeed provides the `MoE` container (the engine detects it, creates the expert-parallel groups and
saves expert checkpoints), `Experts`, the sparse route encode/decode and the expert-parallel all-to-all.
We replace two pieces:

* the gate (`WideNetGate`): the paper's Gaussian logit noise, raw or renormalised combine weights, two
  balance-loss forms, no Gumbel sampling in eval, per-call routing statistics;
* the layer's forward (`SharedMOELayer`): it takes and returns the routing explicitly, and with
  `dispatch = "dropless"` runs the experts on exactly their routed tokens (widenet_ds/dropless.py). WideNet calls the
  one layer D times per forward; DeepSpeed's `MOELayer` keeps `l_aux` in an attribute that each call
  overwrites, and routing groups need to reuse a routing computed earlier, so state must not live in
  the module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepspeed.moe.layer import MoE
from deepspeed.moe.sharded_moe import (MOELayer, TopKGate, _AllToAll, _route_slots, _sparse_decode,
                                       _sparse_encode, gumbel_rsample, multiplicative_jitter)
from deepspeed.utils import groups

from widenet_ds.config import ModelConfig, MoEConfig
from widenet_ds.dropless import dropless_experts


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


class WideNetGate(TopKGate):
    """DeepSpeed's gate module (the engine finds it by type) with WideNet's routing."""

    def __init__(self, hidden_size: int, cfg: MoEConfig) -> None:
        super().__init__(hidden_size, cfg.num_experts, k=cfg.top_k, capacity_factor=cfg.capacity_factor,
                         eval_capacity_factor=cfg.eval_capacity_factor, min_capacity=cfg.min_capacity,
                         noisy_gate_policy=None, drop_tokens=cfg.drop_tokens, use_rts=False,
                         top2_2nd_expert_sampling=cfg.second_expert_sampling)
        self.cfg = cfg

    def forward(self, tokens: Tensor) -> Routing:  # type: ignore[override]
        tokens = tokens.float()
        if self.training and self.cfg.noise == "jitter":
            tokens = multiplicative_jitter(tokens, device=tokens.device)
        logits = F.linear(tokens, self.wg.weight.float())
        return route_tokens(logits, self.cfg, training=self.training, ep_group=self.ep_group)


class SharedMOELayer(MOELayer):
    """DeepSpeed's MOELayer with the routing passed in and returned instead of kept in attributes."""

    def forward(self, hidden: Tensor, routing: Routing | None = None) -> tuple[Tensor, Routing]:  # type: ignore[override]
        # hidden: [..., M]; tokens: [T, M]
        model_dim = hidden.shape[-1]
        tokens = hidden.reshape(-1, model_dim)
        if routing is None:
            routing = self.gate(tokens)
        if self.gate.cfg.dispatch == "dropless":
            combined = dropless_experts(tokens, routing, self.experts.deepspeed_experts)
            return combined.reshape(hidden.shape), routing
        num_experts = self.ep_size * self.num_local_experts
        slots = _route_slots(routing.expert_index, routing.location, num_experts, routing.capacity)
        dispatched = _sparse_encode(tokens, slots, num_experts, routing.capacity)      # [E, C, M]
        if self.ep_size > 1:
            dispatched = _AllToAll.apply(self.ep_group, dispatched)
        # After the all-to-all each rank holds its local experts' slots from every rank: [ep, E_local, C, M]
        expert_out = self.experts(dispatched.reshape(self.ep_size, self.num_local_experts, -1, model_dim))
        expert_out = expert_out.reshape(num_experts, -1, model_dim)
        if self.ep_size > 1:
            expert_out = _AllToAll.apply(self.ep_group, expert_out)
        combined = _sparse_decode(expert_out.reshape(-1, model_dim), slots, routing.weight, tokens.shape[0])
        return combined.reshape(hidden.shape), routing


class FeedForward(nn.Module):
    """H -> F -> H with GELU: a dense FFN, and the shape of every expert."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str) -> None:
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if activation == "gelu_new" else "none"

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate=self.approximate))


def _expert_parallel_rank(ep_size: int) -> int:
    # DeepSpeed forms expert-parallel groups from consecutive ranks: [0..ep-1], [ep..2ep-1], ...
    if ep_size == 1 or not torch.distributed.is_initialized():
        return 0
    return torch.distributed.get_rank() % ep_size


class MoEFeedForward(nn.Module):
    """Router + experts on DeepSpeed's `MoE` container; one call per block that uses it."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        moe_cfg = cfg.moe
        if moe_cfg.ep_size > 1 and (not torch.distributed.is_initialized()
                                    or torch.distributed.get_world_size() % moe_cfg.ep_size):
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            from widenet_ds.errors import ConfigError
            raise ConfigError(f"moe.ep_size = {moe_cfg.ep_size} does not divide the world size {world}; launch a "
                              f"multiple of {moe_cfg.ep_size} ranks or lower moe.ep_size.")
        expert = FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.activation)
        self.moe = MoE(cfg.hidden_size, expert, num_experts=moe_cfg.num_experts, ep_size=moe_cfg.ep_size,
                       k=moe_cfg.top_k, capacity_factor=moe_cfg.capacity_factor,
                       eval_capacity_factor=moe_cfg.eval_capacity_factor, min_capacity=moe_cfg.min_capacity,
                       drop_tokens=moe_cfg.drop_tokens, use_rts=False,
                       top2_2nd_expert_sampling=moe_cfg.second_expert_sampling)
        stock = self.moe.deepspeed_moe
        self.moe.deepspeed_moe = SharedMOELayer(WideNetGate(cfg.hidden_size, moe_cfg), stock.experts,
                                                stock.ep_group_name, stock.ep_size, stock.num_local_experts)
        self.num_experts = moe_cfg.num_experts
        self.ep_size = moe_cfg.ep_size

    @property
    def gate(self) -> WideNetGate:
        return self.moe.deepspeed_moe.gate

    @property
    def experts(self) -> nn.ModuleList:
        return self.moe.deepspeed_moe.experts.deepspeed_experts

    def global_expert_indices(self) -> list[int]:
        first = _expert_parallel_rank(self.ep_size) * len(self.experts)
        return list(range(first, first + len(self.experts)))

    def ensure_process_groups(self) -> None:
        """Create the expert-parallel group when running outside a DeepSpeed engine."""
        if self.moe.deepspeed_moe.ep_group is None:
            if self.moe.expert_group_name in groups._get_expert_parallel_group_dict():
                self.moe.deepspeed_moe._set_ep_group(groups._get_expert_parallel_group(self.moe.expert_group_name))
            else:
                self.moe.set_deepspeed_parallelism()

    def forward(self, hidden: Tensor, routing: Routing | None = None) -> tuple[Tensor, Routing]:
        return self.moe.deepspeed_moe(hidden, routing)
