"""ViT-WideNet image classifier: a ViT body on the shared WideNet encoder (widenet_ds/model/widenet.py).

Patches (a strided conv) -> the authors' constant zero CLS token in front -> learned positions ->
dropout -> the pre-LN WideNet encoder (shared attention, shared MoE, per-block LayerNorms, final
LayerNorm) -> GAP over all tokens or the CLS token -> optional pre-logits Dense + tanh -> classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from widenet_ds.model.base import EncoderModel
from widenet_ds.model.widenet import RoutingStats, WideNetEncoder
from widenet_ds.model.moe import FeedForward, MoEFeedForward
from widenet_ds.vision.config import VisionConfig


@dataclass
class ImageClassificationOutput:
    loss: Tensor | None          # task loss + balance_loss_weight * balance loss
    task_loss: Tensor | None     # cross-entropy (soft targets with mixup / label smoothing)
    balance_loss: Tensor         # summed over the routing calls, unweighted
    logits: Tensor               # [B, num_classes]
    routing: RoutingStats | None = None


class PatchEmbedding(nn.Module):
    """Conv2d(patch, stride patch) -> tokens, the CLS token first (constant zeros or learned), + learned
    positions."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.projection = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, stride=cfg.patch_size)
        self.position = nn.Parameter(torch.zeros(1, cfg.num_tokens, cfg.hidden_size))
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.hidden_size)) if cfg.cls_token == "learned" else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, pixels: Tensor) -> Tensor:
        # pixels: [B, C, H, W] -> [B, 1 + N, H_model]
        patches = self.projection(pixels).flatten(2).transpose(1, 2)
        if self.cls is None:  # the WideNet authors' CLS: zeros, not trained
            cls = patches.new_zeros(patches.shape[0], 1, patches.shape[2])
        else:
            cls = self.cls.expand(patches.shape[0], -1, -1)
        return self.dropout(torch.cat([cls, patches], dim=1) + self.position)


class ViTWideNetForImageClassification(EncoderModel):
    """Image classifier for every vision preset; `ep_size` places the experts (a run choice). Its body has no
    prefix: `embeddings.*` and `encoder.*` sit beside the heads (checkpoints and HF exports hold these keys)."""

    ENCODER_PATH = "encoder"

    def __init__(self, cfg: VisionConfig, ep_size: int = 1) -> None:
        super().__init__(cfg)
        self.embeddings = PatchEmbedding(cfg)
        self.encoder = WideNetEncoder(cfg, ep_size, ffn=self._feed_forwards(cfg, ep_size))
        self.pre_logits = nn.Linear(cfg.hidden_size, cfg.hidden_size) if cfg.pre_logits else None
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_classes)
        self.init_weights()

    @staticmethod
    def _feed_forwards(cfg: VisionConfig, ep_size: int) -> nn.ModuleList:
        """One module when shared, else one per block: MoE where `moe_block_indices` says, dense elsewhere."""
        moe_blocks = set(cfg.moe_block_indices)
        blocks = [0] if cfg.share_ffn else range(cfg.num_layers)
        return nn.ModuleList(
            MoEFeedForward(cfg, ep_size) if i in moe_blocks
            else FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.activation) for i in blocks)

    def init_extra_weights(self, std: float) -> None:
        """The learned positions and the learned CLS token (ViT), after the Linear and Conv2d weights: N(0, std)."""
        self.embeddings.position.normal_(0.0, std)
        if self.embeddings.cls is not None:
            self.embeddings.cls.normal_(0.0, std)

    def forward(self, pixels: Tensor, labels: Tensor | None = None, label_smoothing: float = 0.0,
                sample_weight: Tensor | None = None, branches: int | None = None) -> ImageClassificationOutput:
        """pixels: [B, C, H, W]; labels: int [B] or soft targets [B, classes] (mixup); sample_weight: [B]
        (0 for padding rows of a fixed-shape eval batch); branches: the first k branches only (ParaFormer
        layout; None: all)."""
        x = self.embeddings(pixels)
        x, balance, routing = self.encoder(x, None, branches)
        pooled = x.mean(dim=1) if self.cfg.head == "gap" else x[:, 0]
        if self.pre_logits is not None:
            pooled = torch.tanh(self.pre_logits(pooled))
        logits = self.classifier(pooled)
        task_loss = loss = None
        if labels is not None:
            per_sample = F.cross_entropy(logits.float(), labels, reduction="none", label_smoothing=label_smoothing)
            if sample_weight is None:
                task_loss = per_sample.mean()
            else:
                task_loss = (per_sample * sample_weight).sum() / sample_weight.sum().clamp(min=1.0)
            loss = self._total_loss(task_loss, balance)
        return ImageClassificationOutput(loss, task_loss, balance, logits, routing)


def count_trainable_parameters(model: nn.Module) -> int:
    """Each tensor once (shared modules are registered once, so `parameters()` already deduplicates)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(cfg: VisionConfig, ep_size: int = 1,
                device: str | torch.device | None = None) -> ViTWideNetForImageClassification:
    """The model, optionally on the meta device (parameter counts of the big presets without memory)."""
    if device is None:
        return ViTWideNetForImageClassification(cfg, ep_size)
    with torch.device(device):
        return ViTWideNetForImageClassification(cfg, ep_size)
