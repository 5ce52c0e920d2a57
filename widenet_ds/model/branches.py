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
partial sums. Everything outside the branches (embeddings, final LayerNorm, head) runs replicated, on the
same input, on every rank, so the gradients follow Megatron's tensor-parallel pair: the sum's backward is
the identity (every rank's incoming gradient already is the whole one) and the encoder input's backward
all-reduces (each rank's input gradient covers only its branches). After a backward, every rank then holds
the one-process gradients of its own branches and of everything outside the branches; the modules that
every branch shares (WideNet's attention and MoE) hold this rank's share, summed by
`BranchParallel.all_reduce_shared_gradients` (call it once before each optimizer step, on every rank).
Not covered: a shared MoE routes each rank's tokens by itself, so with capacity dropping (drop_tokens) the
capacity and the dropped routes are per rank, and the balance loss is this rank's branches' own; with
nothing dropped the logits are the one-process ones. Expert parallelism inside the branch group is not
supported (the shared gradients' sum would add different experts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import Tensor, nn

from widenet_ds.errors import ConfigError
from widenet_ds.model.grouped_experts import ExpertWeights
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

    @property
    def process_group(self) -> torch_dist.ProcessGroup:
        return self.group or torch_dist.group.WORLD

    def input(self, x: Tensor) -> Tensor:
        """The encoder input as this rank's branches read it: x, whose gradient is summed over the ranks."""
        return _SumGradientOverRanks.apply(x, self.process_group)

    def sum(self, partial: Tensor) -> Tensor:
        """The sum over all branches from each rank's partial sum; its gradient passes through unchanged."""
        return _SumOverRanks.apply(partial, self.process_group)

    def all_reduce_shared_gradients(self, encoder: nn.Module) -> None:
        """Sum the gradients of the modules every branch uses over the ranks (one all-reduce; a rank whose
        branches were all inactive contributes zeros). Collective: every rank calls it, after the backward."""
        params = [p for p in shared_parameters(encoder) if p.requires_grad]
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch_dist.all_reduce(flat, group=self.process_group)
        for param, summed in zip(params, flat.split([p.numel() for p in params])):
            param.grad = summed.view_as(param)


class _SumOverRanks(torch.autograd.Function):
    """Forward: all-reduce (sum). Backward: identity, as Megatron's reduce-from-tensor-parallel-region.
    (torch.distributed.nn's all_reduce all-reduces the gradient too: with the head replicated on every rank
    that multiplies the branches' gradients by the number of ranks.)"""

    @staticmethod
    def forward(ctx, partial: Tensor, group: torch_dist.ProcessGroup) -> Tensor:
        total = partial.clone(memory_format=torch.contiguous_format)
        torch_dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _SumGradientOverRanks(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (sum), as Megatron's copy-to-tensor-parallel-region."""

    @staticmethod
    def forward(ctx, x: Tensor, group: torch_dist.ProcessGroup) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        torch_dist.all_reduce(grad, group=ctx.group)
        return grad, None


def shared_parameters(encoder: nn.Module) -> list[nn.Parameter]:
    """The parameters of the modules every branch uses (a per-block list of length 1), in a fixed order."""
    return [p for modules in (encoder.attention, encoder.ffn, encoder.attention_norm, encoder.ffn_norm)
            if len(modules) == 1 for p in modules[0].parameters()]


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


def _feed_forward(encoder: nn.Module, blocks: list[int], x: Tensor, experts: ExpertWeights | None,
                  token_mask: Tensor | None = None) -> tuple[Tensor, Routing | None]:
    k, batch, seq, hidden = x.shape
    modules = encoder.ffn
    if len(modules) == 1:
        flat = x.reshape(k * batch, seq, hidden)
        if isinstance(modules[0], MoEFeedForward):
            out, routing = modules[0](flat, None, experts, token_mask)
            return encoder.ffn_dropout(out).view_as(x), routing
        return encoder.ffn_dropout(modules[0](flat)).view_as(x), None
    layers = [modules[i] for i in blocks]  # dense FeedForwards (an MoE per block is refused by the config)
    inner = F.gelu(_stacked_linear([m.fc_in for m in layers], x), approximate=layers[0].approximate)
    return encoder.ffn_dropout(_stacked_linear([m.fc_out for m in layers], inner)), None


def depth_step(encoder: nn.Module, depth: int, branches: list[int], x: Tensor, attend: Tensor | None,
               experts: ExpertWeights | None = None,
               token_mask: Tensor | None = None) -> tuple[Tensor, Routing | None]:
    """One block of every active branch. x: [k, B, S, H], stream i belonging to branches[i]; `experts`: the
    shared MoE's stacked weights of this forward (`WideNetEncoder.shared_expert_weights`); `token_mask`:
    bool [k B, S], False for padding (routed by nobody, see widenet_ds/model/routing.py)."""
    cfg = encoder.cfg
    blocks = [b * cfg.layers_per_branch + depth for b in branches]
    if cfg.norm_position == "post":
        x = _norm(encoder.attention_norm, blocks, x + _attention(encoder.attention, blocks, x, attend))
        out, routing = _feed_forward(encoder, blocks, x, experts, token_mask)
        return _norm(encoder.ffn_norm, blocks, x + out), routing
    normed = cfg.residual == "normed"
    h = _norm(encoder.attention_norm, blocks, x)
    x = (h if normed else x) + _attention(encoder.attention, blocks, h, attend)
    h = _norm(encoder.ffn_norm, blocks, x)
    out, routing = _feed_forward(encoder, blocks, h, experts, token_mask)
    return (h if normed else x) + out, routing
