"""HF ViT export (`widenet-ds convert to-hf-vit`): a dense, unshared ViT saved as a portable folder goes through
the real converter into a folder that `transformers.ViTForImageClassification.from_pretrained` loads with no
missing or unexpected key, and gives our logits; models HF's ViT cannot hold are refused, naming why."""

from __future__ import annotations

import json

import pytest
import torch

from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import ConfigError
from widenet_ds.interop.hf_vit import hf_vit_config
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.portable.format import PortableCheckpoint, save_folder
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("preset, overrides", [("vit-tiny", dict(head="cls")),
                                               ("vit-b16", dict(pre_logits=False, num_classes=1000)),
                                               # bias-free q/k/v and a learned CLS token (ParaFormer's ViT)
                                               ("paraformer-tiny-1x12", dict(residual="standard"))])
def test_dense_vit_converts_to_hf_with_logit_parity(preset, overrides, tmp_path):
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset(preset, **overrides)
    ours = ViTWideNetForImageClassification(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a swapped weight would show
        for name, p in ours.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    save_folder(PortableCheckpoint(cfg, "ViTWideNetForImageClassification", ours.state_dict()), tmp_path / "ours")
    assert widenet_ds(["convert", "to-hf-vit", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 0
    hf, info = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    pixels = torch.rand(2, cfg.num_channels, cfg.image_size, cfg.image_size) * 2 - 1
    with torch.no_grad():
        want = ours(pixels).logits
        got = hf.eval()(pixel_values=pixels).logits
    assert (got - want).abs().max().item() <= 1e-4
    assert want.std() > 0.01  # the logits carry signal


@pytest.mark.parametrize("preset", ["widenet-vit-tiny", "vit-moe-b16", "vit-b16", "paraformer-tiny-3x4",
                                    "paraformer-tiny-1x12"])
def test_models_hf_cannot_hold_are_refused(preset):
    with pytest.raises(ConfigError, match="cannot become a Hugging Face ViTForImageClassification"):
        hf_vit_config(VisionConfig.from_preset(preset))


def test_the_command_refuses_moe_and_text_models_and_writes_nothing(dist, tmp_path, capsys):
    cfg = VisionConfig.from_preset("widenet-vit-digits")
    save_folder(PortableCheckpoint(cfg, "ViTWideNetForImageClassification",
                                   ViTWideNetForImageClassification(cfg).state_dict()), tmp_path / "widenet")
    assert widenet_ds(["convert", "to-hf-vit", str(tmp_path / "widenet"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "one unshared dense FFN per block" in err and "Export it with `widenet-ds convert to-hf`" in err
    text = ModelConfig.from_preset("albert-tiny", vocab_size=50, num_layers=2)
    save_folder(PortableCheckpoint(text, "WideNetForPreTraining", WideNetForPreTraining(text).state_dict()),
                tmp_path / "text")
    assert widenet_ds(["convert", "to-hf-vit", str(tmp_path / "text"), str(tmp_path / "out")]) == 2
    assert "is a WideNetForPreTraining; the HF ViT export needs a ViTWideNetForImageClassification" in \
        capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text", "widenet"]
    assert json.loads((tmp_path / "widenet" / "config.json").read_text())["model"] == cfg.to_dict()
