"""ViT-WideNet model: the paper's exact parameter counts, structure, the authors' router forms, config errors."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.errors import ConfigError
from widenet_ds.model.moe import FeedForward, MoEFeedForward
from widenet_ds.model.routing import expert_capacity
from widenet_ds.vision.config import VISION_PRESETS, VisionConfig
from widenet_ds.vision.model import build_model, count_trainable_parameters

# widenet-paper Tables 1 and 3 (1001 classes, GAP, pre-logits), exact values from the authors' Keras layers
# (docs/vision.md): the paper prints them truncated to millions.
PAPER_COUNTS = {
    "widenet-vit-b16": 29_691_369,
    "widenet-vit-l16": 40_942_569,
    "widenet-vit-h16": 63_343_081,
    "vit-b16": 87_158_249,
    "vit-l16": 305_376_233,
    "vit-moe-b16": 128_090_089,
    "widenet-vit-b16-no-moe": 9_225_449,
    "widenet-vit-b16-shared-ln": 29_657_577,
}


@pytest.mark.parametrize("preset", sorted(PAPER_COUNTS))
def test_trainable_parameter_counts_match_the_paper(preset):
    model = build_model(VisionConfig.from_preset(preset), device="meta")
    assert count_trainable_parameters(model) == PAPER_COUNTS[preset]
    # and the paper's truncated figure (29M, 40M, 63M, 87M, 305M, 128M, 9M, 29M)
    assert PAPER_COUNTS[preset] // 10**6 in (29, 40, 63, 87, 305, 128, 9)


def test_sharing_structure_of_widenet_and_vit_moe():
    widenet = build_model(VisionConfig.from_preset("widenet-vit-b16"), device="meta")
    enc = widenet.encoder
    assert len(enc.attention) == 1 and len(enc.ffn) == 1 and isinstance(enc.ffn[0], MoEFeedForward)
    assert len(enc.attention_norm) == 12 and len(enc.ffn_norm) == 12 and enc.final_norm is not None
    vit_moe = build_model(VisionConfig.from_preset("vit-moe-b16"), device="meta")
    kinds = [type(m) for m in vit_moe.encoder.ffn]
    assert kinds == [FeedForward] * 10 + [MoEFeedForward] * 2
    assert vit_moe.encoder.ffn[11].experts[0].fc_in.out_features == 4096
    assert vit_moe.encoder.ffn[0].fc_in.out_features == 3072


def test_forward_gap_head_routes_every_block_and_cls_is_a_constant_zero(dist):
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset("widenet-vit-digits")
    model = build_model(cfg).eval()
    pixels = torch.randn(5, 1, 8, 8)
    out = model(pixels, torch.tensor([0, 1, 2, 3, 9]))
    assert out.logits.shape == (5, 10)
    assert out.routing.expert_counts.shape == (4, 4)   # 4 blocks route, 4 experts
    # k = 2 routes per token (5 images x 17 tokens) per call, before capacity dropping
    assert out.routing.expert_counts.sum(dim=1).tolist() == [2 * 5 * 17] * 4
    assert torch.isfinite(out.loss) and out.loss > out.task_loss  # balance loss added
    # no CLS parameter: the token is zeros before the positions are added
    names = [n for n, _ in model.named_parameters()]
    assert not any("cls" in n for n in names)
    x = model.embeddings(pixels)
    assert torch.allclose(x[:, 0], model.embeddings.position[0, 0].expand(5, -1))


def test_cls_head_differs_from_gap_head(dist):
    torch.manual_seed(0)
    gap = build_model(VisionConfig.from_preset("vit-digits")).eval()
    torch.manual_seed(0)
    cls = build_model(VisionConfig.from_preset("vit-digits", head="cls")).eval()
    pixels = torch.randn(3, 1, 8, 8)
    assert not torch.allclose(gap(pixels).logits, cls(pixels).logits)


def test_authors_capacity_is_floored_and_joint_over_both_choices():
    # int(T * C * k // E): 197 tokens x 16 images, C 1.2, k 2, E 4 -> floor(1891.2) = 1891 (DeepSpeed: 1892)
    assert expert_capacity(197 * 16, 4, 2, 1.2, "floor") == 1891
    assert expert_capacity(197 * 16, 4, 2, 1.2, "ceil") == 1892
    moe = VisionConfig.from_preset("widenet-vit-b16").moe
    assert (moe.capacity_rounding, moe.noise, moe.combine_weights, moe.balance_loss, moe.min_capacity) == (
        "floor", "gaussian", "raw", "widenet_tf", 0)


def test_every_preset_builds_and_round_trips_json(tmp_path):
    for name in VISION_PRESETS:
        cfg = VisionConfig.from_preset(name)
        cfg.to_json(tmp_path / f"{name}.json")
        assert VisionConfig.load(str(tmp_path / f"{name}.json")) == cfg


@pytest.mark.parametrize("overrides, message", [
    (dict(image_size=30), "not divisible by patch_size = 4"),
    (dict(num_heads=5), "not divisible by num_heads"),
    (dict(moe={"ep_size": 2}), "pass --ep-size 2"),
    (dict(moe_blocks=2), "needs ffn = 'moe' and share_ffn = false"),
    (dict(head="mean"), "VisionConfig.head"),
    (dict(hidden_dropout=1.5), "must be in [0, 1)"),
    (dict(num_classes=0), "must be a positive number"),
])
def test_bad_configs_name_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=None) as err:
        VisionConfig.from_preset("widenet-vit-tiny", **overrides)
    assert message in str(err.value)


def test_unknown_preset_and_unknown_key():
    with pytest.raises(ConfigError, match="Did you mean 'widenet-vit-b16'"):
        VisionConfig.from_preset("widenet-vit-b17")
    with pytest.raises(ConfigError, match="Did you mean 'patch_size'"):
        VisionConfig.from_preset("widenet-vit-tiny", patch_sise=4)
