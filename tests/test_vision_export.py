"""Vision export: a DeepSpeed training checkpoint -> portable folder -> the same logits; dense unshared ViT ->
Hugging Face ViTForImageClassification with logit parity."""

from __future__ import annotations

import deepspeed
import pytest
import torch

from widenet_ds.checkpoint.training import CheckpointManager, TrainingState
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import digits
from widenet_ds.vision.export import ARCHITECTURE, load_folder, read_folder, to_folder, to_hf_vit
from widenet_ds.vision.loader import ImageLoader
from widenet_ds.vision.model import ViTWideNetForImageClassification


@pytest.mark.parametrize("preset, overrides", [("vit-tiny", dict(head="cls")),
                                               ("vit-b16", dict(pre_logits=False, num_classes=1000)),
                                               # bias-free q/k/v and a learned CLS token (ParaFormer's ViT)
                                               ("paraformer-tiny-1x12", dict(residual="standard"))])
def test_dense_vit_converts_to_hf_with_logit_parity(preset, overrides):
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset(preset, **overrides)
    ours = ViTWideNetForImageClassification(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a swapped weight would show
        for name, p in ours.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf = to_hf_vit(cfg, ours.state_dict())
    pixels = torch.rand(2, cfg.num_channels, cfg.image_size, cfg.image_size) * 2 - 1
    with torch.no_grad():
        want = ours(pixels).logits
        got = hf(pixel_values=pixels).logits
    assert (got - want).abs().max().item() <= 1e-4
    assert want.std() > 0.01  # the logits carry signal


@pytest.mark.parametrize("preset", ["widenet-vit-tiny", "vit-moe-b16", "vit-b16", "paraformer-tiny-3x4",
                                    "paraformer-tiny-1x12"])
def test_models_hf_cannot_hold_are_refused(preset):
    cfg = VisionConfig.from_preset(preset)
    with pytest.raises(ConfigError, match="cannot become a Hugging Face ViTForImageClassification"):
        to_hf_vit(cfg, {})


def test_training_checkpoint_to_folder_and_back(dist, tmp_path):
    torch.manual_seed(3)
    cfg = VisionConfig.from_preset("widenet-vit-digits")
    model = ViTWideNetForImageClassification(cfg)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}})
    pixels = torch.rand(4, 1, 8, 8) * 2 - 1
    engine.backward(engine(pixels, torch.tensor([1, 2, 3, 4])).loss)
    engine.step()
    loader = ImageLoader(digits()["train"], 8, 1, 4, 0, 1, seed=0, train=True)
    meta = {"model_config": cfg.to_dict(), "ep_size": 1, "dataset": "digits", "architecture": ARCHITECTURE}
    CheckpointManager(tmp_path / "run" / "checkpoints", 2, 0, 1).save(engine, TrainingState(step=1), loader, meta)

    folder = to_folder(tmp_path / "run", tmp_path / "folder")
    loaded_cfg, state = read_folder(folder)
    assert loaded_cfg == cfg and sum(".deepspeed_experts." in k for k in state) == 4 * 4
    restored = load_folder(folder).eval()
    engine.eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(pixels).logits, engine(pixels).logits, atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="already exists|exists"):
        to_folder(tmp_path / "run", folder)
    with pytest.raises(CheckpointError, match="not a widenet-ds vision folder"):
        read_folder(tmp_path)


def test_init_from_folder_keeps_the_body_and_renews_a_head_of_another_shape(tmp_path):
    from widenet_ds.vision.export import save_folder
    from widenet_ds.vision.train import init_weights_for

    cfg = VisionConfig.from_preset("widenet-vit-digits")
    model = ViTWideNetForImageClassification(cfg)
    folder = save_folder(cfg, model.state_dict(), tmp_path / "pretrained")
    finetune = VisionConfig.from_preset("widenet-vit-digits", num_classes=5)
    kept = init_weights_for(finetune, folder)
    assert "classifier.weight" not in kept and "embeddings.position" in kept
    assert len(kept) == len(model.state_dict()) - 2
    with pytest.raises(CheckpointError, match="embeddings.position"):
        init_weights_for(VisionConfig.from_preset("widenet-vit-digits", image_size=16), folder)
