"""Dropless dispatch for the shared MoE: every route runs, on exactly the tokens routed to it.

DeepSpeed's path (`SharedMOELayer` with `dispatch = "deepspeed"`) copies the tokens into an [E, B, M]
buffer of B = ceil(K * C * T / E) slots per expert, runs every expert on all B rows -- empty slots are
zero rows that still cost a GEMM row each -- and drops the routes that overflow. With K = 2 and C = 1.2
the buffer holds 2.4 T rows for 2 T routes.

Here the routes are laid out sorted by expert in one [K * T, M] buffer (one gather), each expert runs on
its own contiguous slice (sizes = the routing's expert counts), and the results are gathered back into
route order and summed over the K routes with the combine weights. Forward and backward are gathers
only (no scatter-add, whose atomics are slow in bf16 on GPU). The routing is the same as DeepSpeed's path
(same gate, same balance loss), only without a capacity: `route_tokens` keeps every route when
`MoEConfig.dispatch = "dropless"`.

Expert parallelism (ep_size > 1) would need a variable-size all-to-all; `MoEConfig` refuses that
combination (see its error message).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from widenet_ds.model.routing import Routing


def sorted_route_order(routing: Routing) -> tuple[Tensor, Tensor]:
    """(row of each route [K, T], route of each row [K * T]) in the expert-sorted buffer; flat route
    j * T + t is token t's choice j.

    A route's row is its expert's offset plus its slot `location`, the slot order DeepSpeed's gate gives
    (choice j of every token after all choices < j), so no sort is needed: the layout is a permutation.
    """
    counts = routing.expert_counts.to(torch.long)
    offsets = torch.cumsum(counts, dim=0) - counts                                  # [E] first row per expert
    row_of_route = offsets[routing.expert_index.long()] + routing.location.long()  # [k, T]
    route_of_row = torch.empty(row_of_route.numel(), dtype=torch.long, device=row_of_route.device)
    route_of_row[row_of_route.reshape(-1)] = torch.arange(row_of_route.numel(), device=row_of_route.device)
    return row_of_route, route_of_row


class _GatherRoutes(torch.autograd.Function):
    """rows = tokens[token_of_row]; backward sums each token's K row gradients, found by a gather.

    `index_select`'s own backward is an `index_add` (atomics, slow in bf16 on GPU); the layout is a
    permutation of the routes, so its inverse `row_of_route` turns the backward into a gather + sum.
    """

    @staticmethod
    def forward(ctx, tokens: Tensor, token_of_row: Tensor, row_of_route: Tensor) -> Tensor:
        ctx.save_for_backward(row_of_route)
        return tokens.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        (row_of_route,) = ctx.saved_tensors
        k, num_tokens = row_of_route.shape
        grad = grad_rows.index_select(0, row_of_route.reshape(-1)).view(k, num_tokens, -1).sum(dim=0)
        return grad, None, None


class _PermuteRows(torch.autograd.Function):
    """out = rows[order] for a permutation `order`; backward is the inverse permutation, a gather."""

    @staticmethod
    def forward(ctx, rows: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return rows.index_select(0, order)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (inverse,) = ctx.saved_tensors
        return grad_out.index_select(0, inverse), None, None


def dropless_experts(tokens: Tensor, routing: Routing, experts: nn.ModuleList) -> Tensor:
    """sum_j w_j(t) * expert_{e_j(t)}(x_t) for every token, with no capacity and no dropped route.

    tokens: [T, M]; routing: from `route_tokens` with dispatch "dropless" (capacity 0 = unbounded, so no
    -1 in expert_index).
    """
    assert routing.capacity == 0, "a capacity routing has dropped routes: route with dispatch 'dropless'"
    k, num_tokens = routing.expert_index.shape
    row_of_route, route_of_row = sorted_route_order(routing)
    rows = _GatherRoutes.apply(tokens, route_of_row % num_tokens, row_of_route)  # [K * T, M] by expert
    sizes = routing.expert_counts.tolist()                                         # one device -> host sync
    outputs = [expert(chunk) for expert, chunk in zip(experts, rows.split(sizes)) if chunk.shape[0]]
    # Back to route order [K, T, M].
    per_route = _PermuteRows.apply(torch.cat(outputs), row_of_route.reshape(-1), route_of_row)
    per_route = per_route.view(k, num_tokens, -1)
    # Weighted sum over the K routes in fp32, like DeepSpeed's `_sparse_decode` (combine weights are fp32).
    combined = (per_route.float() * routing.weight.unsqueeze(-1)).sum(dim=0)
    return combined.to(tokens.dtype)
