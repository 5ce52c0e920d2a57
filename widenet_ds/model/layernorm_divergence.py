"""The WideNet paper's eq. 9: how far apart the LayerNorms of different blocks are ("Layer Norm Analysis").

For one LayerNorm position (e.g. the one in front of the MoE) of N blocks with M elements each, element i's
divergence is

    y_i = 1 / (M N^2) * sum_j sum_m sum_n I(j != n) |gamma_ij - gamma_mn|

(j and n blocks, m elements), the same for beta. The paper finds it larger in WideNet (blocks share everything
but their LayerNorms) than in ViT (nothing shared): the LayerNorms are what makes the shared block compute
different things at different depths. One LayerNorm shared by all blocks (N = 1) gives 0 by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor


def layernorm_divergence(per_block: Tensor) -> Tensor:
    """y_i of eq. 9 for an (N blocks, M elements) stack of one LayerNorm parameter (gamma or beta): shape (M,)."""
    if per_block.dim() != 2:
        raise ValueError(f"layernorm_divergence takes an (N blocks, M elements) tensor, got shape "
                         f"{tuple(per_block.shape)}; stack one LayerNorm parameter of every block.")
    blocks, elements = per_block.shape
    values = per_block.detach().double()
    # sum over n != j and m of |gamma_ij - gamma_mn| = (distances to all N M values) - (to its own block's M),
    # each a sum of absolute differences to a sorted set: O(N M log(N M)) time and O(N M) memory, where the
    # (N, M, N, M) table of every pair would take 680 MB at N 12, M 768.
    to_all = _sum_of_distances(values.reshape(-1), values.reshape(-1)).view(blocks, elements)
    to_own_block = torch.stack([_sum_of_distances(row, row) for row in values])
    return (to_all - to_own_block).sum(dim=0) / (elements * blocks**2)


def _sum_of_distances(points: Tensor, to: Tensor) -> Tensor:
    """sum_k |points_p - to_k| for every p, from `to` sorted and its prefix sums."""
    ordered = to.sort().values
    prefix = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)])
    below = torch.searchsorted(ordered, points)  # how many of `to` are < points_p
    total, count = prefix[-1], ordered.numel()
    return points * below - prefix[below] + (total - prefix[below]) - points * (count - below)
