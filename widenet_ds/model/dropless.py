"""Expert-sorted dispatch for the shared MoE: each expert runs on exactly the routes it keeps.

DeepSpeed's path (`SharedMOELayer` with `dispatch = "deepspeed"`) copies the tokens into an [E, B, M]
buffer of B = ceil(K * C * T / E) slots per expert, runs every expert on all B rows -- empty slots are
zero rows that still cost a GEMM row each -- and drops the routes that overflow. With K = 2 and C = 1.2
the buffer holds 2.4 T rows for 2 T routes.

Two dispatches run here: "dropless" keeps every route (`route_tokens` gives it no capacity), and
"compact" keeps DeepSpeed's routing decisions -- the same capacity, the same dropped routes, the same
combine weights -- and computes the kept routes only: DeepSpeed's numbers up to float rounding, without
the empty slots' GEMM rows (tests/model/test_dropless.py holds it against the capacity path).

Here the routes are laid out sorted by expert in one buffer (one gather), the experts run as one grouped
GEMM over their contiguous row groups (widenet_ds/model/grouped_experts.py), and the results are gathered
back into route order and summed over the K routes with the combine weights. Forward and backward are
gathers and plain indexed copies (no scatter-add, whose atomics are slow in bf16 on GPU). The routing is
the same as DeepSpeed's path (same gate, same balance loss); a dropped route (compact) is laid out like
a padding position's route: after the last expert's rows, sent to no peer, its result discarded.

No host synchronisation with ep_size 1: the buffer has a static size, K * T rows plus, on CUDA, room to
start every expert's group on a multiple of `GROUP_ALIGNMENT_CUDA` rows (the grouped GEMM's alignment);
the group boundaries are computed on the device from the routing's expert counts and handed to the
grouped GEMM as device-side offsets. Padding rows are zero rows whose results nobody reads.

Expert parallelism (ep_size > 1): each rank sends every expert-parallel peer the rows routed to that
peer's experts with a variable-size `all_to_all_single`. The per-expert counts are exchanged on the device
first (one small all-to-all); the split sizes of the row all-to-all must be host integers for gloo and
NCCL, so `_host_split_sizes` copies a [2, ep] tensor to the host once per call: the only sync of this
path, and unavoidable with `all_to_all_single`. The received rows (grouped by source rank, then by local
expert) are regrouped by local expert for the grouped GEMM and sent back the same way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from widenet_ds.model.grouped_experts import ExpertWeights, group_alignment, grouped_expert_ffn
from widenet_ds.model.routing import Routing


def aligned_groups(counts: Tensor, align: int, total_rows: int) -> tuple[Tensor, Tensor]:
    """(first row of each group [G] int64, group ends [G] int32) for groups of `counts` rows laid out one
    after the other, each starting on a multiple of `align`, the last group running to `total_rows`
    (rows past the real ones belong to it as padding). total_rows must be >= the padded sum."""
    padded = (counts + (align - 1)) // align * align if align > 1 else counts
    if torch.compiler.is_compiling():
        # a running sum over the E groups as a masked sum, which inductor generates in a kernel (exact on
        # integers); cumsum would stay an ATen call
        group = torch.arange(padded.numel(), device=padded.device)
        ends = (padded.unsqueeze(0) * (group.unsqueeze(0) <= group.unsqueeze(1))).sum(dim=1)
    else:
        ends = torch.cumsum(padded, dim=0)
    starts = ends - padded
    ends = torch.cat([ends[:-1], ends.new_full((1,), total_rows)])
    return starts, ends.to(torch.int32)


def padded_rows(num_routes: int, num_groups: int, align: int) -> int:
    """Static row count of an expert-sorted buffer: every route, plus up to align - 1 padding rows per group."""
    return num_routes + num_groups * (align - 1)


def sorted_route_order(routing: Routing, align: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """(row of each route [K, T], route of each row [N] (K * T for a padding row), group ends [E] int32)
    in the expert-sorted buffer of N = padded_rows(K * T, E, align) rows; flat route j * T + t is token t's
    choice j.

    A route's row is its expert's first row plus its slot `location`, the slot order DeepSpeed's gate
    gives (choice j of every token after all choices < j), so no sort is needed. Routes without an expert
    (padding's, and with a capacity the dropped ones) follow the kept rows.
    """
    k, num_tokens = routing.expert_index.shape
    num_routes = k * num_tokens
    counts = kept_counts(routing).to(torch.long)
    total = padded_rows(num_routes, counts.numel(), align)
    starts, ends = aligned_groups(counts, align, total)
    expert = routing.expert_index.long()
    row_of_route = starts[expert] + routing.location.long()                          # [k, T]
    if routing.padded or routing.capacity:
        # Routes without an expert (-1) run nowhere: they take the rows after the last expert's kept ones, in
        # route order, which no peer is sent and whose results their zero weight discards.
        padding = expert < 0
        tail = starts[-1] + counts[-1] + torch.cumsum(padding.reshape(-1), dim=0).view_as(expert) - 1
        row_of_route = torch.where(padding, tail, row_of_route)
    route_of_row = torch.full((total,), num_routes, dtype=torch.long, device=row_of_route.device)
    route_of_row[row_of_route.reshape(-1)] = torch.arange(num_routes, device=row_of_route.device)
    return row_of_route, route_of_row, ends


def kept_counts(routing: Routing) -> Tensor:
    """Routes each expert runs [E]: all of them without a capacity, at most `capacity` with one."""
    if routing.capacity:
        return routing.expert_counts.clamp(max=routing.capacity)
    return routing.expert_counts


class _GatherRoutes(torch.autograd.Function):
    """rows = [tokens; 0][token_of_row] (padding rows read the zero row); backward sums each token's K row
    gradients, found by a gather.

    `index_select`'s own backward is an `index_add` (atomics, slow in bf16 on GPU); every route has one
    row, so its inverse `row_of_route` turns the backward into a gather + sum.
    """

    @staticmethod
    def forward(ctx, tokens: Tensor, token_of_row: Tensor, row_of_route: Tensor, padding: bool) -> Tensor:
        ctx.save_for_backward(row_of_route)
        if padding:
            tokens = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])
        return tokens.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        (row_of_route,) = ctx.saved_tensors
        k, num_tokens = row_of_route.shape
        grad = grad_rows.index_select(0, row_of_route.reshape(-1)).view(k, num_tokens, -1).sum(dim=0)
        return grad, None, None, None


class _TakeRows(torch.autograd.Function):
    """out = rows[index] for distinct indices; backward writes each gradient row back to its source row
    (an indexed copy, no accumulation: nothing is read twice) and zeros elsewhere."""

    @staticmethod
    def forward(ctx, rows: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.num_rows = rows.shape[0]
        return rows.index_select(0, index)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (index,) = ctx.saved_tensors
        grad = grad_out.new_zeros(ctx.num_rows, grad_out.shape[1]).index_copy_(0, index, grad_out)
        return grad, None


class _PlaceRows(torch.autograd.Function):
    """out [num_rows, M] with out[index[i]] = rows[i] (distinct indices), zeros elsewhere; backward is a
    gather."""

    @staticmethod
    def forward(ctx, rows: Tensor, index: Tensor, num_rows: int) -> Tensor:
        ctx.save_for_backward(index)
        return rows.new_zeros(num_rows, rows.shape[1]).index_copy_(0, index, rows)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (index,) = ctx.saved_tensors
        return grad_out.index_select(0, index), None, None


class _AllToAllRows(torch.autograd.Function):
    """Variable-size all-to-all of rows: send_splits[r] rows to rank r, recv_splits[r] rows from rank r."""

    @staticmethod
    def forward(ctx, rows: Tensor, send_splits: list[int], recv_splits: list[int], group) -> Tensor:
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = rows.new_empty(sum(recv_splits), rows.shape[1])
        dist.all_to_all_single(out, rows.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        send_splits, recv_splits = ctx.splits
        return _AllToAllRows.apply(grad_out, recv_splits, send_splits, ctx.group), None, None, None


def sorted_experts(tokens: Tensor, routing: Routing, weights: ExpertWeights, ep_size: int = 1,
                   ep_group=None) -> Tensor:
    """sum_j w_j(t) * expert_{e_j(t)}(x_t) for every token over its kept routes, the experts running on
    expert-sorted rows.

    tokens: [T, M]; routing: from `route_tokens` (dispatch "dropless": capacity 0 = unbounded, -1 in
    expert_index only for padding; "compact": -1 also for a dropped route; either way weight 0 there);
    weights: this rank's experts (E / ep_size of them), stacked.
    """
    k, num_tokens = routing.expert_index.shape
    # Locally the rows only need grouping when the experts run here; with ep > 1 they are sent unpadded.
    align = group_alignment(tokens.device) if ep_size == 1 else 1
    row_of_route, route_of_row, ends = sorted_route_order(routing, align)
    # Token of each row; padding rows (route K * T) read row T, a zero row, when there are any.
    token_of_row = route_of_row % num_tokens if align == 1 else torch.where(
        route_of_row < k * num_tokens, route_of_row % num_tokens, num_tokens)
    rows = _GatherRoutes.apply(tokens, token_of_row, row_of_route, align > 1)  # [N, M] by expert
    if ep_size == 1:
        out_rows = grouped_expert_ffn(rows, ends, weights)
    else:
        out_rows = _expert_parallel_ffn(rows, kept_counts(routing), weights, ep_size, ep_group)
    # Back to route order [K, T, M].
    per_route = _TakeRows.apply(out_rows, row_of_route.reshape(-1)).view(k, num_tokens, -1)
    # Weighted sum over the K routes in fp32, like DeepSpeed's `_sparse_decode` (combine weights are fp32).
    combined = (per_route.float() * routing.weight.unsqueeze(-1)).sum(dim=0)
    return combined.to(tokens.dtype)


def _host_split_sizes(send_counts: Tensor, recv_counts: Tensor, num_rows: int) -> tuple[list[int], list[int]]:
    """Rows to send to / receive from each peer, as host ints for all_to_all_single: the path's one
    device -> host copy (a [2, ep] tensor). Fake tensors hold no counts (a dry run counting a step's memory,
    widenet_ds/engine/activation_memory.py): every one of the `num_rows` rows kept, spread evenly over the peers."""
    if not torch.compiler.is_compiling() and is_fake(send_counts):
        peers = send_counts.shape[0]
        even = [num_rows * (peer + 1) // peers - num_rows * peer // peers for peer in range(peers)]
        return even, even
    sizes = torch.stack([send_counts.sum(dim=1), recv_counts.sum(dim=1)]).tolist()
    return sizes[0], sizes[1]


def _expert_parallel_ffn(rows: Tensor, expert_counts: Tensor, weights: ExpertWeights, ep_size: int,
                         ep_group) -> Tensor:
    """Run rows [K * T, M] sorted by global expert (expert_counts [E] kept rows each, then the routes without
    an expert) on the ranks that hold those experts; same layout back.

    Experts are placed as DeepSpeed places them: rank r of the expert-parallel group holds global experts
    [r * E_local, (r + 1) * E_local).
    """
    local = weights.w_in.shape[0]
    send_counts = expert_counts.to(torch.long).view(ep_size, local)            # [peer, local expert]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ep_group)           # on the device
    send_splits, recv_splits = _host_split_sizes(send_counts, recv_counts, rows.shape[0])
    # Routes without an expert (rows past the counted ones) are sent nowhere; zero rows come back in place.
    sent = sum(send_splits)
    received = _AllToAllRows.apply(rows[:sent], send_splits, recv_splits, ep_group)  # by (source rank, local expert)

    # Regroup by local expert: chunk (r, l) of the received rows goes after the chunks (r' < r, l) in group l.
    num_received = sum(recv_splits)
    align = group_alignment(rows.device)
    total = padded_rows(num_received, local, align)
    starts, ends = aligned_groups(recv_counts.sum(dim=0), align, total)
    flat_counts = recv_counts.reshape(-1)
    chunk_start_received = torch.cumsum(flat_counts, dim=0) - flat_counts
    before_in_group = torch.cumsum(recv_counts, dim=0) - recv_counts          # [ep, local]
    chunk_start_grouped = (starts.unsqueeze(0) + before_in_group).reshape(-1)
    chunk_of_row = torch.repeat_interleave(torch.arange(flat_counts.numel(), device=rows.device), flat_counts,
                                           output_size=num_received)
    target = (chunk_start_grouped[chunk_of_row] + torch.arange(num_received, device=rows.device)
              - chunk_start_received[chunk_of_row])
    grouped = _PlaceRows.apply(received, target, total)
    out = grouped_expert_ffn(grouped, ends, weights)
    out_received = _TakeRows.apply(out, target)
    returned = _AllToAllRows.apply(out_received, recv_splits, send_splits, ep_group)
    if sent == rows.shape[0]:
        return returned
    return torch.cat([returned, returned.new_zeros(rows.shape[0] - sent, returned.shape[1])])
