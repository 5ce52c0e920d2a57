"""EncoderModel (widenet_ds/model/base.py): the text and image models initialise through one `init_weights`, with
the weights each family drew before it existed (its old initialiser is written out here, beside the seed);
one activation-checkpointing switch; one list of MoE layers; one encoder accessor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from widenet_ds.model import widenet
from widenet_ds.model.base import EncoderModel, expert_seed
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.widenet import WideNetForPreTraining, WideNetForSequenceClassification
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

SEED = 20261127


# --- the initialisers before EncoderModel (8927cd6: model/widenet.py's _init_weights, vision/model.py's
# reset_parameters), written out
@torch.no_grad()
def old_text_init(model: nn.Module) -> None:
    cfg = model.cfg
    experts = {id(p) for m in model.modules() if isinstance(m, MoEFeedForward) for p in m.experts.parameters()}
    for module in model.modules():
        if any(id(p) in experts for p in module.parameters(recurse=False)):
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=cfg.initializer_range)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    base_seed = torch.initial_seed()
    for module in model.modules():
        if isinstance(module, MoEFeedForward):
            for expert, index in zip(module.experts, module.global_expert_indices()):
                generator = torch.Generator().manual_seed((base_seed * 1_000_003 + index) % (2 ** 63))
                for linear in (expert.fc_in, expert.fc_out):
                    linear.weight.copy_(torch.empty(linear.weight.shape).normal_(0.0, cfg.initializer_range,
                                                                                 generator=generator))
                    linear.bias.zero_()


@torch.no_grad()
def old_image_init(model: ViTWideNetForImageClassification) -> None:
    std = model.cfg.initializer_range
    moe_layers = [m for m in model.encoder.ffn if isinstance(m, MoEFeedForward)]
    expert_params = {id(p) for moe in moe_layers for p in moe.experts.parameters()}
    for module in model.modules():
        if any(id(p) in expert_params for p in module.parameters(recurse=False)):
            continue
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
    model.embeddings.position.normal_(0.0, std)
    if model.embeddings.cls is not None:
        model.embeddings.cls.normal_(0.0, std)
    base_seed = torch.initial_seed()
    for layer, moe in enumerate(moe_layers):
        for expert, index in zip(moe.experts, moe.global_expert_indices()):
            generator = torch.Generator().manual_seed((base_seed * 1_000_003 + layer * 65_537 + index) % (2 ** 63))
            for linear in (expert.fc_in, expert.fc_out):
                linear.weight.copy_(torch.empty(linear.weight.shape).normal_(0.0, std, generator=generator))
                linear.bias.zero_()


def text_config(**overrides) -> ModelConfig:
    return ModelConfig.from_preset("widenet-tiny-e4", vocab_size=100, **overrides)


def image_config(**overrides) -> VisionConfig:
    return VisionConfig.from_preset("widenet-vit-digits", **overrides)


# family, build(), the old initialiser
FAMILIES = {
    "text shared MoE": (lambda: WideNetForPreTraining(text_config()), old_text_init),
    "text MoE per block": (lambda: WideNetForPreTraining(text_config(share_ffn=False)), old_text_init),
    "text dense (ALBERT)": (lambda: WideNetForSequenceClassification(
        ModelConfig.from_preset("albert-tiny", vocab_size=100), num_labels=3), old_text_init),
    "image shared MoE": (lambda: ViTWideNetForImageClassification(image_config()), old_image_init),
    "image ViT-MoE (MoE in the last 2 blocks)": (
        lambda: ViTWideNetForImageClassification(image_config(share_ffn=False, moe_blocks=2)), old_image_init),
    "image learned CLS": (lambda: ViTWideNetForImageClassification(image_config(cls_token="learned")), old_image_init),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_init_weights_gives_each_family_the_weights_of_its_old_initialiser(family, monkeypatch):
    build, old_init = FAMILIES[family]
    torch.manual_seed(SEED)
    new = build()
    assert isinstance(new, EncoderModel)
    # the same construction (the same global RNG draws up to the initialiser), then the old initialiser
    monkeypatch.setattr(EncoderModel, "init_weights", lambda self: None)
    torch.manual_seed(SEED)
    old = build()
    old_init(old)
    new_state, old_state = new.state_dict(), old.state_dict()
    assert list(new_state) == list(old_state)
    differ = [key for key in new_state if not torch.equal(new_state[key], old_state[key])]
    assert not differ, f"{family}: init_weights moved {differ}"


def test_expert_seeds_are_keyed_by_layer_and_index_with_the_text_formula_as_layer_0():
    base = 1234
    assert expert_seed(base, 0, 3) == (base * 1_000_003 + 3) % (2 ** 63)
    assert expert_seed(base, 2, 3) == (base * 1_000_003 + 2 * 65_537 + 3) % (2 ** 63)
    # ViT-MoE's two MoE layers start different; a text model's unshared MoE layers start as copies (as always)
    torch.manual_seed(SEED)
    image = ViTWideNetForImageClassification(image_config(share_ffn=False, moe_blocks=2))
    first, second = (moe.experts[0].fc_in.weight for moe in image.moe_layers())
    assert not torch.equal(first, second)
    text = WideNetForPreTraining(text_config(share_ffn=False))
    first, second = (moe.experts[0].fc_in.weight for moe in text.moe_layers()[:2])
    assert torch.equal(first, second)


def test_moe_layers_lists_the_encoders_moe_modules_in_both_families():
    text = WideNetForPreTraining(text_config())
    assert text.moe_layers() == [text.widenet.encoder.ffn[0]]
    per_block = WideNetForPreTraining(text_config(share_ffn=False))
    assert per_block.moe_layers() == list(per_block.widenet.encoder.ffn)
    assert len(per_block.moe_layers()) == per_block.cfg.num_moe_layers == per_block.cfg.num_layers
    assert WideNetForPreTraining(ModelConfig.from_preset("albert-tiny", vocab_size=100)).moe_layers() == []
    image = ViTWideNetForImageClassification(image_config())
    assert image.moe_layers() == [image.encoder.ffn[0]]
    vit_moe = ViTWideNetForImageClassification(image_config(share_ffn=False, moe_blocks=2))
    blocks = vit_moe.cfg.moe_block_indices
    assert vit_moe.moe_layers() == [vit_moe.encoder.ffn[i] for i in blocks] and len(blocks) == 2
    assert ViTWideNetForImageClassification(VisionConfig.from_preset("vit-digits")).moe_layers() == []


def test_the_encoder_accessor_keeps_each_familys_state_dict_keys():
    text = WideNetForPreTraining(text_config())
    assert text.encoder is text.widenet.encoder
    assert any(key.startswith("widenet.encoder.") for key in text.state_dict())
    image = ViTWideNetForImageClassification(image_config())
    assert image.encoder is image.get_submodule("encoder")
    keys = list(image.state_dict())
    assert any(key.startswith("encoder.") for key in keys) and "embeddings.position" in keys


@pytest.mark.parametrize("model", [
    pytest.param(lambda: WideNetForPreTraining(text_config()), id="text"),
    pytest.param(lambda: ViTWideNetForImageClassification(image_config()), id="image")])
def test_set_activation_checkpointing_switches_both_families(model, monkeypatch, dist):
    model = model()
    model.ensure_process_groups()
    assert model.encoder.activation_checkpointing is False  # off until the run turns it on
    calls = []
    original = widenet.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(widenet, "checkpoint", counting)
    if isinstance(model, ViTWideNetForImageClassification):
        inputs = (torch.randn(2, 1, 8, 8),)
    else:
        inputs = (torch.randint(5, 100, (2, 8)),)
    for enabled, expected in ((True, model.cfg.num_layers), (False, 0)):
        model.set_activation_checkpointing(enabled)
        assert model.encoder.activation_checkpointing is enabled
        calls.clear()
        model.train()(*inputs)
        assert len(calls) == expected
