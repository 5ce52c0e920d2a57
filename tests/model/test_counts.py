"""FLOP accounting: a hand count for one small config, and PyTorch's FLOP counter on the real model."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from widenet_ds.model.config import ModelConfig
from widenet_ds.model.counts import flops_per_token
from widenet_ds.model.widenet import WideNetForPreTraining

# H 8, F 16, D 2, 2 heads, E_emb 4, V 10, S 4, 4 experts, K 2, C 1.2
SMALL = dict(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, embedding_size=4, vocab_size=10,
             max_position_embeddings=16)


def test_hand_count_for_a_small_widenet():
    cfg = ModelConfig.from_preset("widenet-tiny-e4", **SMALL, moe={"num_experts": 4, "top_k": 2,
                                                                  "capacity_factor": 1.2, "min_capacity": 0})
    count = flops_per_token(cfg, seq_len=4)
    # per token, forward, 2 m n k per GEMM:
    assert count.parts == {
        "embedding_projection": 2 * 4 * 8,                  # 64: E_emb 4 -> H 8
        "attention_projections": 2 * 4 * (2 * 8 * 8),       # 1024: 2 blocks x Q, K, V, O
        "attention_scores": 2 * (2 * 4 * 8 + 2 * 4 * 8),    # 256: 2 blocks x (QK^T + AV) over S = 4
        "experts": 2 * 2 * (2 * 8 * 16 + 2 * 16 * 8),      # 2048: 2 blocks x 2 routes x (8->16->8)
        "router": 2 * (2 * 8 * 4),                          # 128: 2 routing calls x H -> E
        "mlm_head": 2 * 8 * 4 + 2 * 4 * 10,                 # 144: H -> E_emb, decoder E_emb -> V
        "pooler_sop": (2 * 8 * 8 + 2 * 8 * 2) / 4,          # 40: once per sequence of 4 tokens
    }
    assert count.forward == 64 + 1024 + 256 + 2048 + 128 + 144 + 40 == 3704
    assert count.training == 3 * 3704
    # capacity padding: 2 sequences of 4 tokens per call -> B = ceil(2 * 1.2 * 8 / 4) = 5 slots per expert,
    # 20 slots for 16 routes, so the experts cost 20 / 8 = 2.5 routes per token instead of 2
    padded = flops_per_token(cfg, seq_len=4, capacity_padding=True, tokens_per_call=8)
    assert padded.parts["experts"] == 2 * 2.5 * (2 * 8 * 16 + 2 * 16 * 8)
    dense = flops_per_token(ModelConfig.from_preset("albert-tiny", **SMALL), seq_len=4)
    assert "experts" not in dense.parts and dense.parts["ffn"] == 2 * (2 * 8 * 16 + 2 * 16 * 8)


def test_capacity_padding_needs_the_tokens_per_call():
    cfg = ModelConfig.from_preset("widenet-tiny-e4", **SMALL)
    with pytest.raises(ValueError, match="tokens_per_call"):
        flops_per_token(cfg, seq_len=4, capacity_padding=True)


def _counted_forward_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    torch.manual_seed(0)
    model = WideNetForPreTraining(cfg)
    model.ensure_process_groups()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    # The counter has no formula for the fused CPU attention kernel; the math backend's bmm it counts.
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model.train()(ids)
    return counter.get_total_flops()


@pytest.mark.usefixtures("dist")
@pytest.mark.parametrize("preset,moe,padding", [
    ("albert-tiny", {}, False),
    ("widenet-tiny-e4", {"dispatch": "dropless"}, False),               # experts run exactly K routes per token
    ("widenet-tiny-e4", {"dispatch": "deepspeed", "min_capacity": 0}, True),  # E x B capacity slots
])
def test_matches_pytorch_flop_counter_on_the_model(preset, moe, padding):
    batch, seq = 2, 8
    cfg = ModelConfig.from_preset(preset, **SMALL, moe={"noise": "none", **moe})
    ours = flops_per_token(cfg, seq_len=seq, capacity_padding=padding, tokens_per_call=batch * seq)
    assert math.isclose(ours.forward * batch * seq, _counted_forward_flops(cfg, batch, seq))
