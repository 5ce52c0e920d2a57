"""WideNet configurations for transformers: `WideNetConfig` (text) and `ViTWideNetConfig` (images).

Written into every folder that `widenet-ds convert to-hf` exports; needs only transformers (>= 5). Each field
is a field of widenet-ds's own config under the same name (its encoder, MoE, text or image fields), with one
exception: the experts per token, widenet-ds's `moe.top_k`, is `num_experts_per_tok` here (transformers
reserves `top_k` for generation). The usual transformers names are aliases: `num_hidden_layers`,
`num_attention_heads`, `hidden_act`, `hidden_dropout_prob`, `attention_probs_dropout_prob`,
`router_aux_loss_coef`.

Routing fields (docs/model.md of widenet-ds): `dispatch` "compact" (default) and "deepspeed" give every expert
B = ceil(K C T / E) slots per routing call (floor with `capacity_rounding` "floor", at least `min_capacity`; C is
`capacity_factor` in training, `eval_capacity_factor` in eval) and drop the routes that overflow (widenet-ds
computes "compact" without the empty slots; both run here as the capacity buffers); "dropless" runs every
route. Load either way: `from_pretrained(folder, trust_remote_code=True,
dispatch="dropless")`. `route_padding` false (default): padding positions (attention_mask 0) get no route,
take no slot and stay out of the balance loss and the routing counts; true routes them like tokens (the
paper's, and widenet-ds's before the switch).
"""

from __future__ import annotations

from transformers import PreTrainedConfig

_CHOICES = {
    "activation": ("gelu", "gelu_new"),
    "ffn": ("moe", "dense"),
    "residual": ("standard", "normed"),
    "noise": ("gaussian", "jitter", "rsample", "none"),
    "combine_weights": ("raw", "renormalize"),
    "balance_loss": ("switch", "widenet_tf"),
    "dispatch": ("deepspeed", "compact", "dropless"),
    "capacity_rounding": ("ceil", "floor"),
    "norm_position": ("post", "pre"),
    "head": ("gap", "cls"),
    "cls_token": ("zero", "learned"),
}
_ALIASES = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads", "hidden_act": "activation",
            "hidden_dropout_prob": "hidden_dropout", "attention_probs_dropout_prob": "attention_dropout",
            "router_aux_loss_coef": "balance_loss_weight"}


# Adapted from widenet_ds.model.config.EncoderConfig: a transformers PreTrainedConfig holding MoEConfig's fields
#   flat (top_k as num_experts_per_tok) and transformers' aliases; its checks are the ones loading needs, as
#   ValueErrors (ours: every check, as ConfigErrors naming the fix)
class WideNetEncoderConfig(PreTrainedConfig):
    """The encoder both families share: dimensions, sharing, ParaFormer branches, and the shared MoE's router."""

    attribute_map = _ALIASES

    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    activation: str = "gelu"
    share_attention: bool = True
    share_ffn: bool = True
    share_layernorm: bool = False
    ffn: str = "moe"
    num_branches: int = 1
    residual: str = "standard"
    qkv_bias: bool = True
    # the shared MoE (widenet-ds's MoEConfig)
    num_experts: int = 4
    num_experts_per_tok: int = 2
    capacity_factor: float = 1.2
    eval_capacity_factor: float = 2.0
    min_capacity: int = 4
    drop_tokens: bool = True
    noise: str = "gaussian"
    second_expert_sampling: bool = False
    combine_weights: str = "raw"
    balance_loss: str = "switch"
    balance_loss_weight: float = 0.01
    dispatch: str = "compact"
    capacity_rounding: str = "ceil"
    route_padding: bool = False

    def __post_init__(self, **kwargs):
        for name, choices in _CHOICES.items():
            if hasattr(self, name) and getattr(self, name) not in choices:
                raise ValueError(f"{type(self).__name__}.{name} = {getattr(self, name)!r}; pick one of "
                                 f"{list(choices)}.")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}.")
        if self.num_layers % self.num_branches:
            raise ValueError(f"num_branches {self.num_branches} must divide num_layers {self.num_layers}.")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts {self.num_experts}.")
        super().__post_init__(**kwargs)

    # Copied from widenet_ds.model.config.EncoderConfig.is_moe
    @property
    def is_moe(self) -> bool:
        return self.ffn == "moe"

    # Copied from widenet_ds.model.config.EncoderConfig.layers_per_branch
    @property
    def layers_per_branch(self) -> int:
        return self.num_layers // self.num_branches

    # Copied from widenet_ds.model.config.EncoderConfig.experts_width
    @property
    def experts_width(self) -> int:
        """The experts' hidden width."""
        return self.intermediate_size

    # Copied from widenet_ds.model.config.EncoderConfig.blocks_per_routing_group
    @property
    def blocks_per_routing_group(self) -> int:
        """Consecutive blocks that reuse the routing of the group's first block (1: every MoE block routes)."""
        return 1

    # Copied from widenet_ds.model.config.EncoderConfig.moe_block_indices
    @property
    def moe_block_indices(self) -> list[int]:
        """Blocks whose FFN is an MoE."""
        return list(range(self.num_layers)) if self.is_moe else []


# Adapted from widenet_ds.model.config.ModelConfig: transformers' config fields with our defaults; no presets,
#   JSON files or overrides (transformers' from_pretrained and keywords do that)
class WideNetConfig(WideNetEncoderConfig):
    """A WideNet / ALBERT / BERT text model with ALBERT's factorized embeddings (widenet-ds's ModelConfig)."""

    model_type = "widenet"

    vocab_size: int = 30000
    embedding_size: int = 128
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    classifier_dropout: float = 0.1
    norm_position: str = "post"
    routing_groups: int | None = None

    # Adapted from widenet_ds.model.config.ModelConfig.blocks_per_routing_group: routing_groups None (a config made
    #   in Python) is num_layers, which our __post_init__ writes into the field
    @property
    def blocks_per_routing_group(self) -> int:
        return self.num_layers // (self.routing_groups or self.num_layers) if self.is_moe else 1


# Adapted from widenet_ds.vision.config.VisionConfig: transformers' config fields with our defaults (the WideNet
#   authors' ViT) and id2label for transformers' heads and pipelines; no presets
class ViTWideNetConfig(WideNetEncoderConfig):
    """A ViT body on the WideNet encoder with its classification head (widenet-ds's VisionConfig): always pre-LN
    with a final LayerNorm; the defaults are the WideNet authors' ViT."""

    model_type = "vit_widenet"
    norm_position = "pre"  # a constant of the image family, not a field

    intermediate_size: int = 4096
    hidden_dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    activation: str = "gelu_new"
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    num_classes: int = 1001
    expert_intermediate_size: int | None = None
    moe_blocks: int | None = None
    head: str = "gap"
    pre_logits: bool = True
    cls_token: str = "zero"

    def __post_init__(self, **kwargs):
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}.")
        if self.id2label is None:  # the classes are the labels transformers' heads and pipelines read
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_classes)}
            self.label2id = {f"LABEL_{i}": i for i in range(self.num_classes)}
        super().__post_init__(**kwargs)
        if self.id2label is not None and len(self.id2label) != self.num_classes:
            raise ValueError(f"id2label names {len(self.id2label)} classes, num_classes is {self.num_classes}.")

    # Copied from widenet_ds.vision.config.VisionConfig.num_patches
    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    # Copied from widenet_ds.vision.config.VisionConfig.num_tokens
    @property
    def num_tokens(self) -> int:
        """Patches + the CLS token (which the authors' capacity counts too)."""
        return self.num_patches + 1

    # Copied from widenet_ds.vision.config.VisionConfig.moe_block_indices
    @property
    def moe_block_indices(self) -> list[int]:
        """Blocks whose FFN is an MoE: the last `moe_blocks` (ViT-MoE), else every block."""
        if not self.is_moe:
            return []
        first = self.num_layers - (self.moe_blocks or self.num_layers)
        return list(range(first, self.num_layers))

    # Copied from widenet_ds.vision.config.VisionConfig.experts_width
    @property
    def experts_width(self) -> int:
        return self.expert_intermediate_size or self.intermediate_size
