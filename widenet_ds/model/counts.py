"""Parameter and FLOP counts of the models: parameters counted from instantiated models (text and image), by
part; model FLOPs per token of the text model counted from the config, for MFU and speed targets. The counts
of every preset: `widenet-ds params` (widenet_ds/commands/params.py).

FLOP conventions (the usual MFU ones, e.g. PaLM's appendix B, Megatron's):
* a GEMM [m, k] x [k, n] costs 2 m n k; element-wise work (softmax, LayerNorm, GELU, residuals) and
  embedding look-ups are not counted;
* training = 3 x forward (backward = 2 x forward: gradients w.r.t. inputs and weights);
* attention scores and values over the full sequence S (QK^T and AV: 2 x 2 S H per token), padding
  included, as the fused kernel computes them;
* the MLM decoder over ALL positions, as `MaskedLMHead` computes logits for every position (HF ALBERT
  does the same), not only the ~15% masked ones;
* experts: K routes per token (`capacity_padding=False`, the FLOPs the model needs); with
  `capacity_padding=True`, E x B slots per routing call, B = ceil(K * C * T / E), as DeepSpeed's
  capacity path runs them (empty slots are zero rows that still cost a GEMM row);
* pooler and SOP head once per sequence, spread over its S tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from widenet_ds.model.config import ModelConfig
from widenet_ds.model.routing import expert_capacity

PARTS = ("embeddings", "attention", "experts", "router", "ffn", "norms", "heads")


def _part(name: str) -> str:
    name = name.removeprefix("widenet.")  # the text models' body; the image model's has no prefix
    if name.startswith("embeddings."):  # text: tables and their LayerNorm; images: patches, positions, CLS
        return "norms" if ".norm." in name else "embeddings"
    if name.startswith("encoder."):
        if ".gate." in name:
            return "router"
        if ".deepspeed_experts." in name:
            return "experts"
        if name.startswith("encoder.attention."):
            return "attention"
        if name.startswith("encoder.ffn."):
            return "ffn"
        return "norms"
    return "heads"  # text: pooler, MLM, SOP; images: pre-logits, classifier


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable parameters, each shared tensor once, split by part; `total` is their sum."""
    counts = dict.fromkeys(PARTS, 0)
    for name, param in model.named_parameters():  # named_parameters() yields shared tensors once
        if param.requires_grad:
            counts[_part(name)] += param.numel()
    counts["total"] = sum(counts.values())
    return counts


# --- FLOPs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopCount:
    """Forward matmul FLOPs per token, by part."""

    parts: dict[str, float]

    @property
    def forward(self) -> float:
        return sum(self.parts.values())

    @property
    def training(self) -> float:
        return 3.0 * self.forward


def flops_per_token(cfg: ModelConfig, seq_len: int, *, capacity_padding: bool = False,
                    tokens_per_call: int | None = None, training: bool = True) -> FlopCount:
    """Forward FLOPs per token of `WideNetForPreTraining(cfg)` at sequence length `seq_len`.

    `capacity_padding=True` counts DeepSpeed's capacity buffers and needs `tokens_per_call` (tokens per
    routing call on one rank, i.e. micro-batch x seq_len); `training` picks the train or eval capacity factor.
    """
    H, F, D, S = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, seq_len
    emb, vocab = cfg.embedding_size, cfg.vocab_size
    parts = {
        "embedding_projection": 2 * emb * H,
        "attention_projections": D * 4 * 2 * H * H,          # Q, K, V, output
        "attention_scores": D * 2 * 2 * S * H,               # QK^T and AV
    }
    ffn_per_route = 2 * 2 * H * F                            # H -> F -> H
    if cfg.is_moe:
        moe = cfg.moe
        routes = moe.top_k
        if capacity_padding:
            if tokens_per_call is None:
                raise ValueError("capacity_padding=True needs tokens_per_call (micro-batch x seq_len).")
            factor = moe.capacity_factor if training else moe.eval_capacity_factor
            slots = moe.num_experts * max(expert_capacity(tokens_per_call, moe.num_experts, moe.top_k, factor),
                                          moe.min_capacity)
            routes = slots / tokens_per_call
        parts["experts"] = D * routes * ffn_per_route
        parts["router"] = cfg.num_routing_calls * 2 * H * moe.num_experts
    else:
        parts["ffn"] = D * ffn_per_route
    parts["mlm_head"] = 2 * H * emb + 2 * emb * vocab       # dense H -> E_emb, tied decoder E_emb -> V
    parts["pooler_sop"] = (2 * H * H + 2 * H * 2) / S        # once per sequence
    return FlopCount({name: float(value) for name, value in parts.items()})
