"""The shared Mixture-of-Experts layer, built on DeepSpeed's MoE.

DeepSpeed provides the `MoE` container (the engine detects it, creates the expert-parallel groups and
saves expert checkpoints), `Experts`, the sparse route encode/decode and the expert-parallel all-to-all.
We replace two pieces:

* the gate (`WideNetGate`): the paper's Gaussian logit noise, raw or renormalised combine weights, two
  balance-loss forms, no Gumbel sampling in eval, per-call routing statistics;
* the layer's forward (`SharedMOELayer`): it takes and returns the routing explicitly, and with
  `dispatch = "dropless"` or `"compact"` runs the experts on exactly the routes they keep, sorted by expert
  (widenet_ds/model/dropless.py). WideNet calls the
  one layer D times per forward; DeepSpeed's `MOELayer` keeps `l_aux` in an attribute that each call
  overwrites, and routing groups need to reuse a routing computed earlier, so state must not live in
  the module. Both dispatches run the experts as grouped GEMMs over the stacked expert weights
  (widenet_ds/model/grouped_experts.py); the weights stay in DeepSpeed's `Experts` module, and the encoder
  stacks them once per forward for all D calls (`MoEFeedForward.expert_weights`): a view, where they are
  packed as built here, not a copy.

The forward never synchronises with the host (ep_size 1; dropless with ep_size > 1 copies its all-to-all
split sizes once, see dropless.py) and traces whole under `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

import contextlib
import io

import torch
import torch.nn.functional as F
from deepspeed.moe.layer import MoE
from deepspeed.moe.sharded_moe import (
    MOELayer,
    TopKGate,
    _AllToAll,
    _sparse_decode,
    _sparse_encode,
)
from deepspeed.utils import groups
from torch import Tensor, nn

from widenet_ds.model.config import EncoderConfig, MoEConfig
from widenet_ds.model.dropless import sorted_experts
from widenet_ds.model.grouped_experts import ExpertWeights, batched_expert_ffn, pack_expert_parameters
from widenet_ds.model.routing import Routing, multiplicative_jitter, route_tokens


class WideNetGate(TopKGate):
    """DeepSpeed's gate module (the engine finds it by type) with WideNet's routing."""

    def __init__(self, hidden_size: int, cfg: MoEConfig) -> None:
        super().__init__(hidden_size, cfg.num_experts, k=cfg.top_k, capacity_factor=cfg.capacity_factor,
                         eval_capacity_factor=cfg.eval_capacity_factor, min_capacity=cfg.min_capacity,
                         noisy_gate_policy=None, drop_tokens=cfg.drop_tokens, use_rts=False,
                         top2_2nd_expert_sampling=cfg.second_expert_sampling)
        self.cfg = cfg

    def forward(self, tokens: Tensor, token_mask: Tensor | None = None) -> Routing:  # type: ignore[override]
        """tokens [T, M]; token_mask: bool [T], False for padding (None: all real; see `route_tokens`)."""
        tokens = tokens.float()
        if self.training and self.cfg.noise == "jitter":
            tokens = multiplicative_jitter(tokens)
        logits = F.linear(tokens, self.wg.weight.float())
        return route_tokens(logits, self.cfg, training=self.training, token_mask=token_mask)


class SharedMOELayer(MOELayer):
    """DeepSpeed's MOELayer with the routing passed in and returned instead of kept in attributes."""

    def forward(self, hidden: Tensor, routing: Routing | None = None,  # type: ignore[override]
                weights: ExpertWeights | None = None, token_mask: Tensor | None = None) -> tuple[Tensor, Routing]:
        # hidden: [..., M]; tokens: [T, M]; token_mask: bool [...] (hidden's leading dims), False for padding
        model_dim = hidden.shape[-1]
        tokens = hidden.reshape(-1, model_dim)
        if routing is None:
            routing = self.gate(tokens, None if token_mask is None else token_mask.reshape(-1))
        if weights is None:
            weights = ExpertWeights.stack(self.experts.deepspeed_experts)
        if self.gate.cfg.dispatch != "deepspeed":
            combined = sorted_experts(tokens, routing, weights, self.ep_size, self.ep_group)
            return combined.reshape(hidden.shape), routing
        num_experts = self.ep_size * self.num_local_experts
        dispatched = _sparse_encode(tokens, routing.slot, num_experts, routing.capacity)      # [E, C, M]
        if self.ep_size > 1:
            dispatched = _AllToAll.apply(self.ep_group, dispatched)
        # After the all-to-all each rank holds its local experts' slots from every rank: [ep, E_local, C, M];
        # the experts see [E_local, ep, C, M] (the views DeepSpeed's `Experts` gives them).
        local = dispatched.reshape(self.ep_size, self.num_local_experts, -1, model_dim).transpose(0, 1)
        expert_out = batched_expert_ffn(local, weights).transpose(0, 1).reshape(num_experts, -1, model_dim)
        if self.ep_size > 1:
            expert_out = _AllToAll.apply(self.ep_group, expert_out)
        combined = _sparse_decode(expert_out.reshape(-1, model_dim), routing.slot, routing.weight, tokens.shape[0])
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

    def __init__(self, cfg: EncoderConfig, ep_size: int = 1) -> None:
        super().__init__()
        moe_cfg = cfg.moe
        expert = FeedForward(cfg.hidden_size, cfg.experts_width, cfg.activation)
        self.moe = MoE(cfg.hidden_size, expert, num_experts=moe_cfg.num_experts, ep_size=ep_size,
                       k=moe_cfg.top_k, capacity_factor=moe_cfg.capacity_factor,
                       eval_capacity_factor=moe_cfg.eval_capacity_factor, min_capacity=moe_cfg.min_capacity,
                       drop_tokens=moe_cfg.drop_tokens, use_rts=False,
                       top2_2nd_expert_sampling=moe_cfg.second_expert_sampling)
        stock = self.moe.deepspeed_moe
        self.moe.deepspeed_moe = SharedMOELayer(WideNetGate(cfg.hidden_size, moe_cfg), stock.experts,
                                                stock.ep_group_name, stock.ep_size, stock.num_local_experts)
        pack_expert_parameters(self.experts)
        self.num_experts = moe_cfg.num_experts
        self.ep_size = ep_size

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
                with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints "No existing process group ..."
                    self.moe.set_deepspeed_parallelism()

    def expert_weights(self) -> ExpertWeights:
        """This rank's experts' weights, stacked: once per forward for the D calls of a shared layer (D stacks
        and their D gradient sums per expert tensor would be 4 D operators instead of 4)."""
        return ExpertWeights.stack(self.experts)

    def forward(self, hidden: Tensor, routing: Routing | None = None,
                weights: ExpertWeights | None = None, token_mask: Tensor | None = None) -> tuple[Tensor, Routing]:
        """`routing`: reuse an earlier call's decisions (routing groups); `weights`: `expert_weights()` of
        this forward (None: stacked here); `token_mask`: bool, hidden's leading shape, False where a position
        is padding (no route, no capacity, no balance loss: `route_tokens`); None: every position routes."""
        return self.moe.deepspeed_moe(hidden, routing, weights, token_mask)
