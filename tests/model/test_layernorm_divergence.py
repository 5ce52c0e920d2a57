import pytest
import torch

from widenet_ds.model.layernorm_divergence import layernorm_divergence


def eq9_by_loops(gamma: torch.Tensor) -> list[float]:
    """The paper's eq. 9 term by term: y_i = 1/(M N^2) sum_j sum_m sum_n I(j != n) |gamma_ij - gamma_mn|."""
    blocks, elements = gamma.shape
    return [sum(abs(gamma[j, i].item() - gamma[n, m].item())
                for j in range(blocks) for m in range(elements) for n in range(blocks) if j != n)
            / (elements * blocks**2) for i in range(elements)]


def test_eq9_matches_the_formula_term_by_term():
    gamma = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    assert layernorm_divergence(gamma).tolist() == pytest.approx(eq9_by_loops(gamma), rel=1e-12)


def test_identical_or_single_layernorms_do_not_diverge_and_spread_ones_do():
    same = torch.ones(4, 8)
    assert layernorm_divergence(same).abs().max() == 0  # every block's LayerNorm at its initial value
    assert layernorm_divergence(torch.randn(1, 8)).abs().max() == 0  # one shared LayerNorm: N = 1
    spread = same + torch.arange(4.0)[:, None]  # blocks 0..3 apart by 1 at every element
    # each (j, n != j) pair contributes |j - n| for all M elements: sum over ordered pairs is 20, / N^2 = 16
    assert layernorm_divergence(spread).tolist() == pytest.approx([20 / 16] * 8)


def test_a_tensor_of_the_wrong_rank_is_refused():
    with pytest.raises(ValueError, match="N blocks, M elements"):
        layernorm_divergence(torch.ones(8))
