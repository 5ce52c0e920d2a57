"""Vision model configuration (ViT-WideNet, ViT, ViT-MoE, ParaFormer) and its named presets.

A `VisionConfig` is the shared encoder's config (`EncoderConfig`: dimensions, dropouts, sharing flags, MoE,
branches) plus the image fields (size, patch, channels, classes, head) and ViT-MoE's MoE-in-the-last-blocks.
The encoder is always pre-LN with a final LayerNorm. Expert parallelism is a run flag (`--ep-size`), not
part of the model.

The presets' dimensions and router forms are the authors' (XueFuzhao/WideNet_Code, see
docs/vision.md): pre-LN with eps 1e-6, tanh-GELU, dropout 0.1, E = 4, top-2, C = 1.2, Gaussian logit
noise std 1/E, raw top-k probabilities as combine weights, one joint capacity int(T * C * k // E),
balance loss alpha * E^2 * mean(P * f) with both choices counted / k, alpha = 0.01.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from widenet_ds.errors import ConfigError
from widenet_ds.model.config import Activation, EncoderConfig, NormPosition, check_choice, check_positive

Head = Literal["gap", "cls"]
ClsToken = Literal["zero", "learned"]


@dataclass
class VisionConfig(EncoderConfig):
    """A ViT body on the WideNet encoder, with its image classification head.

    `ffn = "moe"` with `share_ffn` is WideNet (one MoE for all blocks); with `share_ffn = false`,
    `moe_blocks = n` puts an MoE in the last n blocks only and a dense FFN in the others (ViT-MoE;
    None: every block). `expert_intermediate_size` is the experts' hidden width when it differs from
    the dense FFN's `intermediate_size` (ViT-MoE-B: experts 4096, dense blocks 3072).

    `head`: "gap" averages all tokens (the CLS token included, as the authors' code does), "cls" takes
    the CLS token. `cls_token = "zero"` is the WideNet authors' constant zero vector (no parameters),
    "learned" a trained one (lucidrains' ViT, ParaFormer). `pre_logits` adds Dense(hidden) + tanh before
    the classifier.

    ParaFormer: `num_branches` N > 1 arranges the num_layers blocks as N parallel branches summed before
    the final LayerNorm, `residual = "normed"` is its LN(x) + f(LN(x)) sub-layer, `qkv_bias = false` its
    bias-free query/key/value projection (see EncoderConfig and docs/paraformer.md).
    """

    NAME: ClassVar[str] = "vision model config"
    PRESET_NAME: ClassVar[str] = "vision preset"
    norm_position: ClassVar[NormPosition] = "pre"  # the authors' ViT: pre-LN blocks, a final LayerNorm

    # The encoder's defaults for images (the authors' ViT): experts of 4096, dropout 0.1, eps 1e-6, tanh-GELU.
    intermediate_size: int = 4096
    hidden_dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    activation: Activation = "gelu_new"
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    num_classes: int = 1001
    expert_intermediate_size: int | None = None
    moe_blocks: int | None = None
    head: Head = "gap"
    pre_logits: bool = True
    cls_token: ClsToken = "zero"

    def __post_init__(self) -> None:
        check_positive(self, "image_size", "patch_size", "num_channels", "num_classes")
        for name, literal in (("head", Head), ("cls_token", ClsToken)):
            check_choice(self, name, literal)
        if self.image_size % self.patch_size:
            fits = [p for p in range(self.patch_size, 0, -1) if self.image_size % p == 0][0]
            raise ConfigError(
                f"VisionConfig.image_size = {self.image_size} is not divisible by patch_size = {self.patch_size}; "
                f"the patches must tile the image: use patch_size {fits} or an image_size that is a multiple of "
                f"{self.patch_size} (e.g. {self.image_size // self.patch_size * self.patch_size or self.patch_size}).")
        if self.expert_intermediate_size is not None:
            check_positive(self, "expert_intermediate_size")
        super().__post_init__()
        if self.is_moe and self.moe.route_padding:
            raise ConfigError("VisionConfig: moe.route_padding = true routes padding tokens, and an image has none "
                              "(every patch is a token); it would change nothing: drop --set moe.route_padding=true.")
        if self.moe_blocks is not None:
            if self.ffn != "moe" or self.share_ffn:
                raise ConfigError("VisionConfig.moe_blocks (MoE in the last n blocks only) needs ffn = 'moe' and "
                                  "share_ffn = false; a shared FFN is the same module in every block.")
            if not 1 <= self.moe_blocks <= self.num_layers:
                raise ConfigError(f"VisionConfig.moe_blocks = {self.moe_blocks} must be in 1..num_layers "
                                  f"({self.num_layers}).")

    # -- derived -------------------------------------------------------------------------------------
    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """Patches + the CLS token (which the authors' capacity counts too)."""
        return self.num_patches + 1

    @property
    def moe_block_indices(self) -> list[int]:
        """Blocks whose FFN is an MoE: the last `moe_blocks` (ViT-MoE), else every block."""
        if not self.is_moe:
            return []
        first = self.num_layers - (self.moe_blocks or self.num_layers)
        return list(range(first, self.num_layers))

    @property
    def experts_width(self) -> int:
        return self.expert_intermediate_size or self.intermediate_size

    @classmethod
    def presets(cls) -> dict[str, Any]:
        return VISION_PRESETS


# --- presets ----------------------------------------------------------------------------------------
# The authors' router (model_configs.py::Router/Switch): noise std 1/E, raw top-k probabilities, one joint
# capacity int(T*C*k // E) with no minimum, the same capacity in eval (fixed at build time), balance loss
# alpha*E^2*mean(P*f) with both choices / k, alpha 0.01.
AUTHORS_ROUTER = dict(num_experts=4, top_k=2, capacity_factor=1.2, eval_capacity_factor=1.2, min_capacity=0,
                      noise="gaussian", combine_weights="raw", balance_loss="widenet_tf", balance_loss_weight=0.01,
                      capacity_rounding="floor")

_B16 = dict(hidden_size=768, num_layers=12, num_heads=12)
_L16 = dict(hidden_size=1024, num_layers=24, num_heads=16)
_H16 = dict(hidden_size=1280, num_layers=32, num_heads=16)
_IMAGENET = dict(image_size=224, patch_size=16, num_channels=3, num_classes=1001, pre_logits=True)
_WIDENET = dict(ffn="moe", share_attention=True, share_ffn=True, share_layernorm=False, head="gap")
_VIT = dict(ffn="dense", share_attention=False, share_ffn=False, share_layernorm=False, head="cls")
# CPU presets: Fashion-MNIST (28 px, 1 channel, patch 4: 49 patches) and sklearn digits (8 px, patch 2).
# Init std 0.1, about the Glorot scale of the authors' Keras default init at these widths: BERT's 0.02
# leaves such narrow models on a long loss plateau (digits: 59% vs 97% test accuracy after 120 steps).
_FMNIST = dict(image_size=28, patch_size=4, num_channels=1, num_classes=10, pre_logits=False,
               hidden_size=96, num_layers=6, num_heads=4, intermediate_size=192, initializer_range=0.1)
_DIGITS = dict(image_size=8, patch_size=2, num_channels=1, num_classes=10, pre_logits=False,
               hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128, initializer_range=0.1)


# ParaFormer (DUAT-Maker/Shallow-Paraformer, see docs/paraformer.md): lucidrains-style ViT of hidden 192, 3 heads of
# 64, FFN 768, dropout 0.1, bias-free q/k/v, LN(x) + f(LN(x)) sub-layers, a learned CLS token, LayerNorm +
# Linear head, images resized to 224 with patches of 16; CIFAR-10 as in its Table 1. N x L: branches x layers.
_PARAFORMER = dict(image_size=224, patch_size=16, num_channels=3, num_classes=10, hidden_size=192, num_heads=3,
                   intermediate_size=768, hidden_dropout=0.1, attention_dropout=0.1, layer_norm_eps=1e-5,
                   activation="gelu", head="cls", pre_logits=False, cls_token="learned", residual="normed",
                   qkv_bias=False, ffn="dense", share_attention=False, share_ffn=False, share_layernorm=False)
# CPU scale for Fashion-MNIST: 12 layers of the same form at hidden 64 on 28 px (patches of 7: 16 + CLS tokens),
# init as _FMNIST.
_PARAFORMER_TINY = dict(_PARAFORMER, image_size=28, patch_size=7, num_channels=1, hidden_size=64, num_heads=4,
                        intermediate_size=128, initializer_range=0.1)
# WideNet x ParaFormer: every branch layer uses the one shared attention and the one shared MoE (the authors'
# router, E 4), with its own LayerNorms.
_SHARED_MOE = dict(ffn="moe", share_attention=True, share_ffn=True)


def _layout(branches: int, layers: int) -> dict[str, int]:
    return dict(num_branches=branches, num_layers=branches * layers)


def _preset(*parts: dict, router: bool = True):
    def build() -> dict[str, Any]:
        data: dict[str, Any] = {}
        for part in parts:
            data.update(part)
        data["moe"] = dict(AUTHORS_ROUTER) if router else {}
        return data
    return build


VISION_PRESETS = {
    # Table 1: WideNet-B/L/H (configs.py get_moeb16/moel16/moeh14_config; H's patches are 16).
    "widenet-vit-b16": _preset(_IMAGENET, _B16, _WIDENET, dict(intermediate_size=4096)),
    "widenet-vit-l16": _preset(_IMAGENET, _L16, _WIDENET, dict(intermediate_size=4096)),
    "widenet-vit-h16": _preset(_IMAGENET, _H16, _WIDENET, dict(intermediate_size=5120)),
    # Baselines: ViT-B/L (token head), ViT-MoE-B (MoE of 4 experts of 4096 in the last 2 blocks, GAP head).
    "vit-b16": _preset(_IMAGENET, _B16, _VIT, dict(intermediate_size=3072), router=False),
    "vit-l16": _preset(_IMAGENET, _L16, _VIT, dict(intermediate_size=4096), router=False),
    "vit-moe-b16": _preset(_IMAGENET, _B16, _VIT, dict(ffn="moe", head="gap", intermediate_size=3072,
                                                       expert_intermediate_size=4096, moe_blocks=2)),
    # Table 3 ablations of WideNet-B: one shared dense FFN of mlp_dim 3072; one LayerNorm pair for all blocks.
    "widenet-vit-b16-no-moe": _preset(_IMAGENET, _B16, _WIDENET, dict(ffn="dense", intermediate_size=3072),
                                      router=False),
    "widenet-vit-b16-shared-ln": _preset(_IMAGENET, _B16, _WIDENET, dict(intermediate_size=4096,
                                                                         share_layernorm=True)),
    # CPU presets: WideNet, the dense unshared ViT of the same dims, and the shared-without-MoE ablation.
    "widenet-vit-tiny": _preset(_FMNIST, _WIDENET),
    "vit-tiny": _preset(_FMNIST, _VIT, dict(head="gap"), router=False),
    "widenet-vit-tiny-no-moe": _preset(_FMNIST, _WIDENET, dict(ffn="dense"), router=False),
    "widenet-vit-digits": _preset(_DIGITS, _WIDENET),
    "vit-digits": _preset(_DIGITS, _VIT, dict(head="gap"), router=False),
    # ParaFormer's Table 1 (PF N x L; 1 x 12 and 1 x 24 are the sequential ViT12 / ViT24 of the same code).
    **{f"paraformer-{n}x{depth // n}": _preset(_PARAFORMER, _layout(n, depth // n), router=False)
       for depth in (12, 24) for n in (1, 2, 3, 4, 6, 12, 24) if depth % n == 0 and not (depth == 24 and n == 3)},
    "widenet-paraformer-3x4": _preset(_PARAFORMER, _layout(3, 4), _SHARED_MOE),
    "paraformer-tiny-1x12": _preset(_PARAFORMER_TINY, _layout(1, 12), router=False),
    "paraformer-tiny-3x4": _preset(_PARAFORMER_TINY, _layout(3, 4), router=False),
    "paraformer-tiny-4x3": _preset(_PARAFORMER_TINY, _layout(4, 3), router=False),
    "widenet-paraformer-tiny-3x4": _preset(_PARAFORMER_TINY, _layout(3, 4), _SHARED_MOE),
}
# The paper's ImageNet models (Tables 1 and 3), as `BASE_PRESETS` are its text ones.
PAPER_PRESETS = ("widenet-vit-b16", "widenet-vit-l16", "widenet-vit-h16", "vit-b16", "vit-l16", "vit-moe-b16",
                 "widenet-vit-b16-no-moe", "widenet-vit-b16-shared-ln")
