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
    # |gamma_ij - gamma_mn| for every (j, i) against every (n, m): (N, M, N, M), summed over m.
    distances = (values[:, :, None, None] - values[None, None, :, :]).abs().sum(dim=3)
    other_block = ~torch.eye(blocks, dtype=torch.bool)  # I(j != n), indexed (j, n)
    per_element = (distances * other_block[:, None, :]).sum(dim=(0, 2))
    return per_element / (elements * blocks**2)
