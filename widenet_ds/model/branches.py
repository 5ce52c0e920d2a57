"""ParaFormer's branch layout on the WideNet encoder: N branches of L blocks, all reading the embedded input,
their output sequences summed (the authors' G_sum: no weights; the head that follows is the shared one).

Branch b owns blocks b*L .. b*L+L-1, so the first k branches are the first k*L blocks: compressing a model
to k branches keeps a prefix of every per-block module list, and expanding it appends blocks.

The active branches run as one batched computation per depth, not a loop over branches:
* a shared module (WideNet's attention, its one MoE) runs once over the k streams stacked along the batch,
  [k*B, S, H]: one GEMM per projection and one routing call over the tokens of all active branches;
* per-branch weights (LayerNorms, unshared attention, dense FFNs) are stacked at call time and applied with
  batched matrix products over [k, B*S, H].
Each branch keeps its own parameter tensors: a branch outside the active set is a set of parameters that
gets no gradient, which optimizers skip entirely (`WideNetEncoder.set_trainable_branches`).

Branch-parallel (`BranchParallel`): each rank runs its share of the branches and one all-reduce sums the
partial sums; the all-reduce is differentiable, so it trains too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce

from widenet_ds.errors import ConfigError
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.routing import Routing


@dataclass
class BranchParallel:
    """This rank's branches and the group whose ranks hold the others (their union: every branch once)."""

    group: torch_dist.ProcessGroup | None
    branches: tuple[int, ...]

    @classmethod
    def contiguous(cls, num_branches: int, rank: int, world_size: int,
                   group: torch_dist.ProcessGroup | None = None) -> "BranchParallel":
        """Branches split into world_size contiguous runs, the first ranks taking one more when uneven."""
        if world_size > num_branches:
            raise ConfigError(f"branch-parallel over {world_size} ranks needs at least as many branches; the model "
                              f"has {num_branches}: use at most {num_branches} ranks.")
        base, extra = divmod(num_branches, world_size)
        start = rank * base + min(rank, extra)
        return cls(group, tuple(range(start, start + base + (rank < extra))))

    def sum(self, partial: Tensor) -> Tensor:
        """The sum over all branches from each rank's partial sum (gradients flow back to every rank)."""
        return differentiable_all_reduce(partial, group=self.group or torch_dist.group.WORLD)


def branch_blocks(layers_per_branch: int, branch: int) -> range:
    return range(branch * layers_per_branch, (branch + 1) * layers_per_branch)


def active_branches(num_branches: int, branches: int | None) -> list[int]:
    """The k-prefix of the branches (None: all)."""
    if branches is None:
        return list(range(num_branches))
    if not 1 <= branches <= num_branches:
        raise ConfigError(f"branches = {branches}: the model has {num_branches} branches; pick 1..{num_branches}.")
    return list(range(branches))


def _stacked_linear(layers: list[nn.Linear], x: Tensor) -> Tensor:
    # x: [k, B, S, in] -> [k, B, S, out], layer i applied to stream i
    k, batch, seq, width = x.shape
    weight = torch.stack([layer.weight for layer in layers]).transpose(1, 2)       # [k, in, out]
    flat = x.reshape(k, batch * seq, width)
    if layers[0].bias is None:
        out = torch.bmm(flat, weight)
    else:
        out = torch.baddbmm(torch.stack([layer.bias for layer in layers])[:, None], flat, weight)
    return out.view(k, batch, seq, -1)


def _norm(modules: nn.ModuleList, blocks: list[int], x: Tensor) -> Tensor:
    if len(modules) == 1:
        return modules[0](x)
    norms = [modules[i] for i in blocks]
    weight = torch.stack([n.weight for n in norms])[:, None, None]                 # [k, 1, 1, H]
    bias = torch.stack([n.bias for n in norms])[:, None, None]
    return torch.addcmul(bias, F.layer_norm(x, norms[0].normalized_shape, eps=norms[0].eps), weight)


def _attention(modules: nn.ModuleList, blocks: list[int], x: Tensor, attend: Tensor | None) -> Tensor:
    k, batch, seq, hidden = x.shape
    if len(modules) == 1:
        return modules[0](x.reshape(k * batch, seq, hidden), attend).view(k, batch, seq, hidden)
    layers = [modules[i] for i in blocks]
    q, key, v = (_stacked_linear([getattr(m, name) for m in layers], x).reshape(k * batch, seq, hidden)
                 for name in ("query", "key", "value"))
    context = layers[0].context(q, key, v, attend).view(k, batch, seq, hidden)
    return layers[0].dropout(_stacked_linear([m.output for m in layers], context))


def _feed_forward(encoder: nn.Module, blocks: list[int], x: Tensor) -> tuple[Tensor, Routing | None]:
    k, batch, seq, hidden = x.shape
    modules = encoder.ffn
    if len(modules) == 1:
        flat = x.reshape(k * batch, seq, hidden)
        if isinstance(modules[0], MoEFeedForward):
            out, routing = modules[0](flat)
            return encoder.ffn_dropout(out).view_as(x), routing
        return encoder.ffn_dropout(modules[0](flat)).view_as(x), None
    layers = [modules[i] for i in blocks]  # dense FeedForwards (an MoE per block is refused by the config)
    inner = F.gelu(_stacked_linear([m.fc_in for m in layers], x), approximate=layers[0].approximate)
    return encoder.ffn_dropout(_stacked_linear([m.fc_out for m in layers], inner)), None


def depth_step(encoder: nn.Module, depth: int, branches: list[int], x: Tensor,
               attend: Tensor | None) -> tuple[Tensor, Routing | None]:
    """One block of every active branch. x: [k, B, S, H], stream i belonging to branches[i]."""
    cfg = encoder.cfg
    blocks = [b * cfg.layers_per_branch + depth for b in branches]
    if cfg.norm_position == "post":
        x = _norm(encoder.attention_norm, blocks, x + _attention(encoder.attention, blocks, x, attend))
        out, routing = _feed_forward(encoder, blocks, x)
        return _norm(encoder.ffn_norm, blocks, x + out), routing
    normed = cfg.residual == "normed"
    h = _norm(encoder.attention_norm, blocks, x)
    x = (h if normed else x) + _attention(encoder.attention, blocks, h, attend)
    h = _norm(encoder.ffn_norm, blocks, x)
    out, routing = _feed_forward(encoder, blocks, h)
    return (h if normed else x) + out, routing
