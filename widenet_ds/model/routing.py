"""Token routing of the shared MoE: top-k choice, capacity, balance loss and routing statistics.

`route_tokens` turns router logits into a `Routing` (DeepSpeed's sparse-route layout: [k, T] per field)
that the MoE layer dispatches with; it is a plain function of the logits so that routing groups can reuse
one call's decisions and the tests can compare it with DeepSpeed's `top2gating` exactly.

It never synchronises with the host: every size (the capacity included) follows from the logits' shape
and the config, never from their values, so `torch.compile(route_tokens, fullgraph=True)` traces it whole
and a GPU never waits for the CPU to read a routing decision (tests/engine/test_compile.py checks both).

Padding (`token_mask`, on unless `MoEConfig.route_padding`): a padding position is no token of the batch,
so it gets no route (expert_index -1, weight 0: its MoE output is 0 and the residual carries it through),
takes no capacity slot (the real tokens' slots are numbered among real routes only), and does not enter
the balance loss (me = mean router probability and ce = fraction routed, both over the real tokens) or the
routing statistics (`expert_counts`, hence the dropped routes, count real routes only). DeepSpeed's
`top1gating` has the same `used_token` mask for the routes and slots, but keeps padding in its balance
loss (me over all positions, ce divided by all positions); Mesh-TF / T5X-style routers keep it out.

The capacity stays B = ceil(K * C * T / E) with T the number of positions (padding included): a size read
from the shape, so routing never waits for the host to count the real tokens, torch.compile keeps one
graph per shape, and every expert-parallel rank sizes the same all-to-all buffers. The real tokens of a
padded batch therefore get more room than C promises (C * T / T_real per real token), never less.
With `route_padding = True` padding routes as a real token, the paper-literal behaviour (and
the numbers of every run before the mask, bit for bit).
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
    expert_counts: Tensor     # int32 [E], routes assigned to each expert before capacity dropping
    slot: Tensor | None       # int64 [k, T], slot in the [E * capacity] buffer, E * capacity where dropped
                              # (DeepSpeed's `_route_slots`); None with dropless dispatch
    padded: bool = False      # some positions may be padding (expert_index -1 without a dropped route)

    @property
    def dropped_routes(self) -> Tensor:
        """Routes dropped by capacity (int scalar)."""
        return dropped_routes(self.expert_counts, self.capacity)


def dropped_routes(expert_counts: Tensor, capacity: int) -> Tensor:
    """Routes dropped by capacity, from the counts [..., E] before dropping: every route past an expert's
    `capacity` slots (0: unbounded, nothing dropped). Sums the last dim."""
    if capacity == 0:
        return expert_counts.new_zeros(expert_counts.shape[:-1])
    return (expert_counts - capacity).clamp_(min=0).sum(dim=-1)


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


def gaussian_noise(like: Tensor, std: float) -> Tensor:
    """N(0, std^2) samples of `like`'s shape. Eager: `normal_(0, std)`, one operator. Compiled: `randn * std`,
    which the compiler generates inside the kernel that adds it (one seed per graph for all blocks, where
    `normal_` stays a call of its own per block plus a copy); the same numbers under a non-inductor backend."""
    if torch.compiler.is_compiling():
        return torch.randn_like(like) * std
    return torch.empty_like(like).normal_(0.0, std)


def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
    """x * U(1 - epsilon, 1 + epsilon): DeepSpeed's `multiplicative_jitter` (same numbers for the same RNG
    state), traceable by torch.compile."""
    low = torch.tensor(1.0 - epsilon, device=x.device)
    high = torch.tensor(1.0 + epsilon, device=x.device)
    return x * (low + torch.rand(x.shape, device=x.device) * (high - low))


def route_tokens(logits: Tensor, cfg: MoEConfig, *, training: bool, token_mask: Tensor | None = None) -> Routing:
    """Top-k routing with capacity (paper eq. 1-5, 8; GShard-style slot assignment as DeepSpeed's).

    logits: fp32 [T, E] router outputs f(x). Choice j of every token is placed after all choices < j
    (DeepSpeed's order), so with k = 2, C and drop rules equal, this is DeepSpeed's `top2gating` (up to ties:
    of two equally probable experts either may be chosen). Sync-free (no `.item()`, no size read from a
    tensor), see the module docstring.

    token_mask: bool [T], True for a real token, False for padding (None: every position is a token). A
    padding position gets no route, no slot and no share of the balance loss or the counts (module docstring).

    Few operators (each a kernel launch on a GPU, ~20 in all): one top-k gives the choices and their
    probabilities, and one scan over the routes' one-hot gives every route's slot, the expert counts
    and the top-1 counts of the balance loss.
    """
    num_tokens, num_experts = logits.shape
    k = cfg.top_k
    if training and cfg.noise == "gaussian":
        # Paper: g(x) = TopK(softmax(f(x) + eps)), eps ~ N(0, 1/E^2).
        logits = logits + gaussian_noise(logits, 1.0 / num_experts)
    probs = F.softmax(logits, dim=1)
    weight, choice = _choices(logits, probs, cfg, training)                  # [T, k] each

    # Route j * T + t is token t's choice j: every 1st choice before any 2nd choice (DeepSpeed's slot order).
    route_expert = choice.t().reshape(-1)                                     # [k T]
    # hits[e, r]: route r goes to expert e. Expert-major, so that the scan runs along the contiguous dim: on a
    # GPU the outer-dim scan of a [k T, E] with few experts runs nearly serially (1.3 ms at T = 8192, E = 4 on
    # an H100). Padding's routes are cleared here: they take no slot and no count.
    hits = torch.arange(num_experts, device=logits.device).unsqueeze(1) == route_expert
    padding = None                                                            # [k T]: padding's routes
    if token_mask is not None:
        real_routes = token_mask.repeat(k)
        hits &= real_routes
        padding = ~real_routes
    seen = torch.cumsum(hits, dim=1, dtype=torch.int32)                       # [E, k T]: routes so far, per expert
    position = seen.gather(0, route_expert.unsqueeze(0)).squeeze(0)           # [k T]: 1 + the route's slot
    expert_counts = seen[:, -1]                                               # routes per expert, before dropping

    if padding is None:
        mean_prob = probs.mean(dim=0)
        real_tokens = num_tokens
    else:
        # Over the real tokens only (a tensor: counting them on the host would sync); an all-padding batch
        # has a zero loss.
        real_tokens = token_mask.sum().clamp(min=1)
        mean_prob = probs.masked_fill(padding[:num_tokens].unsqueeze(1), 0.0).sum(dim=0) / real_tokens
    if cfg.balance_loss == "switch":
        # l = E * sum_i m_i P_i with m_i the fraction of tokens whose top-1 is expert i (the first T routes).
        routed_fraction = seen[:, num_tokens - 1] / real_tokens
    else:
        # The authors' TF code: both choices counted, divided by k.
        routed_fraction = expert_counts / real_tokens / k
    balance_loss = num_experts * torch.sum(mean_prob * routed_fraction)

    expert_index = route_expert.to(torch.int32)
    location = position - 1
    weight = weight.t()                                                       # [k, T]
    # Dropless: every route runs on its expert, no capacity to compute, no route to drop (padding has none).
    capacity, slot = 0, None
    if cfg.dispatch == "dropless":
        if padding is not None:
            expert_index = expert_index.masked_fill_(padding, -1)
            location = location.masked_fill_(padding, 0)
            weight = weight.masked_fill(padding.view(k, num_tokens), 0.0)
    else:
        capacity = _capacity(cfg, num_tokens, num_experts, training)
        dropped = position > capacity
        if padding is not None:
            dropped |= padding                                                # no route, as a dropped one
        slot = (route_expert * capacity + location).masked_fill_(dropped, num_experts * capacity).view(k, num_tokens)
        expert_index = expert_index.masked_fill_(dropped, -1)
        location = location.masked_fill_(dropped, 0)                          # 0 for a dropped route, as DeepSpeed
        weight = weight.masked_fill(dropped.view(k, num_tokens), 0.0)
    if cfg.combine_weights == "renormalize":
        weight = weight / torch.clamp(weight.sum(dim=0, keepdim=True), min=torch.finfo(weight.dtype).eps)
    return Routing(balance_loss, capacity, expert_index.view(k, num_tokens), location.view(k, num_tokens), weight,
                   expert_counts, slot, padded=token_mask is not None)


def _choices(logits: Tensor, probs: Tensor, cfg: MoEConfig, training: bool) -> tuple[Tensor, Tensor]:
    """(probability, expert) of each token's k choices, [T, k] each, choice 0 first: the k most probable
    experts; with DeepSpeed's sampling policies (training only) the first choice by its own scores (`rsample`:
    Gumbel-perturbed logits) and the later ones by Gumbel-perturbed logits (`second_expert_sampling`)."""
    rsample = training and cfg.noise == "rsample"
    sampled = training and cfg.second_expert_sampling
    if not (rsample or sampled):
        return probs.topk(cfg.top_k, dim=1)
    first_scores = logits + gumbel_noise(logits.shape, logits.device) if rsample else probs
    choice = first_scores.argmax(dim=1, keepdim=True)
    if cfg.top_k > 1:
        later_scores = logits + gumbel_noise(logits.shape, logits.device) if sampled else logits
        later = later_scores.scatter(1, choice, float("-inf")).topk(cfg.top_k - 1, dim=1).indices
        choice = torch.cat([choice, later], dim=1)
    return probs.gather(1, choice), choice


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
