"""The WideNet model itself (its parity with HF ALBERT: checkpoint/test_albert_parity.py): what is shared across
blocks and what each block keeps, one routing call per block with the balance loss summed over them, the
task heads' losses, and padding that real tokens never see."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import (
    WideNetForPreTraining,
    WideNetForQuestionAnswering,
    WideNetForSequenceClassification,
)


def batch(vocab: int = 100, size: int = 3, length: int = 10):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (size, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("preset, shared_blocks, shared_norms", [
    ("widenet-tiny-e4", True, False), ("albert-tiny", True, True), ("bert-tiny-factorized", False, False)])
def test_what_the_blocks_share(preset, shared_blocks, shared_norms):
    cfg = ModelConfig.from_preset(preset, vocab_size=100)
    encoder = WideNetForPreTraining(cfg).encoder
    blocks = 1 if shared_blocks else cfg.num_layers
    assert (len(encoder.attention), len(encoder.ffn)) == (blocks, blocks)
    assert len(encoder.attention_norm) == len(encoder.ffn_norm) == (1 if shared_norms else cfg.num_layers)
    # WideNet: every block keeps its own LayerNorms, and they are distinct parameters
    norms = {id(p) for module in encoder.attention_norm for p in module.parameters()}
    assert len(norms) == 2 * len(encoder.attention_norm)


def test_one_routing_call_per_block_and_the_balance_loss_is_their_sum(dist):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=100)
    model = WideNetForSequenceClassification(cfg, num_labels=3).eval()
    ids, mask = batch()
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        out = model(ids, attention_mask=mask, labels=labels)
    assert out.routing.expert_counts.shape == (cfg.num_layers, cfg.moe.num_experts)
    # each routing call gives every real token top_k routes (padding none)
    assert 0 < mask.sum() < mask.numel()
    assert out.routing.expert_counts.sum(dim=1).tolist() == [int(mask.sum()) * cfg.moe.top_k] * cfg.num_layers
    assert out.loss == pytest.approx((out.task_loss + cfg.moe.balance_loss_weight * out.balance_loss).item())
    assert out.task_loss == pytest.approx(F.cross_entropy(out.logits, labels).item())


def test_regression_and_span_heads(dist):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("albert-tiny", vocab_size=100)
    ids, mask = batch()
    regression = WideNetForSequenceClassification(cfg, num_labels=1).eval()
    scores = torch.tensor([0.5, 3.0, 4.5])
    with torch.no_grad():
        out = regression(ids, attention_mask=mask, labels=scores)
    assert out.loss == pytest.approx(F.mse_loss(out.logits.squeeze(-1), scores).item())  # dense: no balance term
    qa = WideNetForQuestionAnswering(cfg).eval()
    start, end = torch.tensor([1, 2, 0]), torch.tensor([3, 2, 0])
    with torch.no_grad():
        out = qa(ids, attention_mask=mask, start_positions=start, end_positions=end)
    assert (out.start_logits[0, 6:] == -1e4).all()  # padding is never an answer boundary
    expected = (F.cross_entropy(out.start_logits, start) + F.cross_entropy(out.end_logits, end)) / 2
    assert out.loss == pytest.approx(expected.item())


def test_real_tokens_never_see_the_padding(dist):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("albert-tiny", vocab_size=100)  # dense: no capacity the padding could take
    model = WideNetForPreTraining(cfg).eval()
    ids, mask = batch()
    other = ids.clone()
    other[0, 6:] = 7  # other tokens where the mask says padding
    with torch.no_grad():
        a, b = model(ids, attention_mask=mask), model(other, attention_mask=mask)
    torch.testing.assert_close(a.mlm_logits[0, :6], b.mlm_logits[0, :6], atol=1e-6, rtol=0)
    torch.testing.assert_close(a.sop_logits, b.sop_logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.mlm_logits[1:], b.mlm_logits[1:], atol=0, rtol=0)


def test_the_package_gives_the_models_by_name():
    """`from widenet_ds.model import WideNetForPreTraining` (widenet_ds/model/__init__.py, resolved when asked)."""
    from widenet_ds import model

    assert model.WideNetForPreTraining is WideNetForPreTraining and model.ModelConfig is ModelConfig
    with pytest.raises(AttributeError, match="no attribute 'WideNetForTranslation'"):
        model.WideNetForTranslation  # noqa: B018
