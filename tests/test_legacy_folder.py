"""Portable folders written by earlier code (tests/assets/README.md) still load, with the logits that code
computed from them: a text folder of the pre-restructuring code, and an image folder of the layout
`python -m widenet_ds.vision.export` wrote (its config under "vision_model") before the image model joined the
shared folder format."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from widenet_ds.checkpoint.load import load_pretrained
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.checkpoint.format import read_folder
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

ASSETS = Path(__file__).parent / "assets"


def test_folder_of_the_old_layout_gives_identical_logits(dist):
    expected = load_file(ASSETS / "legacy_expected_logits.safetensors")
    model, report = load_pretrained(WideNetForPreTraining, ASSETS / "legacy_folder")
    assert not report.new and not report.unused and report.saved_ep_size == 2
    model.eval()
    with torch.no_grad():
        out = model(input_ids=expected["input_ids"], token_type_ids=expected["token_type_ids"],
                    attention_mask=expected["attention_mask"])
    assert torch.equal(out.mlm_logits, expected["mlm_logits"])
    assert torch.equal(out.sop_logits, expected["sop_logits"])


IMAGE_ASSET = ASSETS / "legacy_image_folder"


def test_image_folder_of_the_old_layout_gives_identical_logits(dist):
    expected = load_file(ASSETS / "legacy_image_expected_logits.safetensors")
    checkpoint = read_folder(IMAGE_ASSET)
    assert checkpoint.architecture == "ViTWideNetForImageClassification" and isinstance(checkpoint.config, VisionConfig)
    assert (checkpoint.config.hidden_size, checkpoint.config.num_classes) == (16, 5)
    model, report = load_pretrained(ViTWideNetForImageClassification, IMAGE_ASSET)
    assert not report.new and not report.unused and report.loaded == len(checkpoint.state)
    model.eval()
    with torch.no_grad():  # to float rounding: the CPU kernels' order of summation may differ between machines
        torch.testing.assert_close(model(expected["pixels"]).logits, expected["logits"], atol=1e-6, rtol=0)
