"""`EncoderModel`: what the text models (widenet_ds/model/widenet.py) and the image model
(widenet_ds/vision/model.py) share around the WideNet encoder: the weight initialisation, the MoE layers, the
activation-checkpointing switch, expert-parallel groups outside an engine, and the total loss.

As HF's `PreTrainedModel._init_weights` (ALBERT adds only its family's extras): one initialiser, and a family
adds what it alone holds (`init_extra_weights`). A family says where its encoder sits (`ENCODER_PATH`); the
state-dict keys stay the family's own (text: `widenet.encoder.*`, images: `encoder.*`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from widenet_ds.model.config import EncoderConfig
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.seeds import SEED_SPACING


def expert_seed(base_seed: int, layer: int, index: int) -> int:
    """The seed of expert `index` (global) of MoE layer `layer`: the same whatever the ep_size."""
    return (base_seed * SEED_SPACING + layer * 65_537 + index) % (2 ** 63)


class EncoderModel(nn.Module):
    """Base of every widenet-ds model built on `WideNetEncoder`.

    `ep_size` (expert parallelism: each rank holds num_experts / ep_size experts) is how a model is laid out
    over ranks, not what it computes: the run's parallel plan passes it to DeepSpeed's MoE, which sizes its
    local experts when it is built; the model does not keep it."""

    # Where the encoder sits, dotted: "widenet.encoder" (text: in the body) or "encoder" (images: no body prefix).
    ENCODER_PATH: ClassVar[str]
    # Expert seeds keyed by (MoE layer, index) when True; by (0, index) for every layer when False, which the
    # text models have always done (their MoE layers, when not shared, start as copies of each other).
    EXPERT_SEEDS_PER_LAYER: ClassVar[bool] = True

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg

    @property
    def encoder(self) -> nn.Module:
        """The model's `WideNetEncoder` (widenet_ds/model/widenet.py)."""
        module: nn.Module = self
        for name in self.ENCODER_PATH.split("."):
            module = module._modules[name]  # not getattr: "encoder" is this property's own name
        return module

    def moe_layers(self) -> list[MoEFeedForward]:
        """The MoE modules of the encoder, in block order (one when shared)."""
        return [m for m in self.encoder.ffn if isinstance(m, MoEFeedForward)]

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute each block in the backward pass instead of keeping its activations (a run setting)."""
        self.encoder.activation_checkpointing = enabled

    def ensure_process_groups(self) -> None:
        """Expert-parallel groups for use outside a DeepSpeed engine (the engine makes them itself)."""
        for moe in self.moe_layers():
            moe.ensure_process_groups()

    @torch.no_grad()
    def init_weights(self) -> None:
        """BERT/ALBERT/ViT initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorms.

        Non-expert tensors draw from the global RNG in module order, then the family's extras
        (`init_extra_weights`); each expert draws from its own generator keyed by (MoE layer, global expert
        index), so the model is the same whatever the ep_size.
        """
        std = self.cfg.initializer_range
        moe_layers = self.moe_layers()
        expert_modules = {id(m) for moe in moe_layers for m in moe.experts.modules()}
        for module in self.modules():
            if id(module) in expert_modules:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        self.init_extra_weights(std)
        base_seed = torch.initial_seed()
        for layer, moe in enumerate(moe_layers):
            key = layer if self.EXPERT_SEEDS_PER_LAYER else 0
            for expert, index in zip(moe.experts, moe.global_expert_indices()):
                generator = torch.Generator().manual_seed(expert_seed(base_seed, key, index))
                for linear in (expert.fc_in, expert.fc_out):
                    linear.weight.copy_(torch.empty(linear.weight.shape).normal_(0.0, std, generator=generator))
                    linear.bias.zero_()

    def init_extra_weights(self, std: float) -> None:
        """The family's parameters that are not in a Linear, Embedding, Conv2d or LayerNorm (none by default);
        drawn after those, from the global RNG."""

    def _total_loss(self, task_loss: Tensor | None, balance: Tensor) -> Tensor | None:
        """The task loss plus the weighted balance loss (MoE models); None without a task loss."""
        if task_loss is None:
            return None
        if self.cfg.is_moe:
            return task_loss + self.cfg.moe.balance_loss_weight * balance
        return task_loss
