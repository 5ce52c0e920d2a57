"""Portable folders written by earlier code (tests/assets/README.md) still load, with the logits that code
computed from them: a text folder of the pre-restructuring code, computed in a child process with portable
arithmetic (tests/portable_arithmetic.py) so that the comparison stays exact on any x86-64 CPU; and an image
folder of the layout `python -m widenet_ds.vision.export` wrote (its config under "vision_model") before the
image model joined the shared folder format."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from launching import REPO
from portable_arithmetic import run_portable_python
from widenet_ds.checkpoint.format import read_folder
from widenet_ds.checkpoint.load import load_pretrained
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

ASSETS = REPO / "tests" / "assets"
LEGACY_LOGITS = REPO / "tests" / "scripts" / "legacy_logits.py"
IMAGE_ASSET = ASSETS / "legacy_image_folder"


def test_folder_of_the_old_layout_gives_identical_logits(tmp_path):
    expected = ASSETS / "legacy_expected_logits.safetensors"
    out = tmp_path / "logits.safetensors"
    run_portable_python(LEGACY_LOGITS, [str(expected), str(out)])
    with safe_open(out, "pt") as f:
        report = json.loads(f.metadata()["report"])
    assert report == {"new": [], "unused": [], "saved_ep_size": 2}
    got, want = load_file(out), load_file(expected)
    assert torch.equal(got["mlm_logits"], want["mlm_logits"]), \
        f"MLM logits differ by up to {(got['mlm_logits'] - want['mlm_logits']).abs().max():.3g}"
    assert torch.equal(got["sop_logits"], want["sop_logits"]), \
        f"SOP logits differ by up to {(got['sop_logits'] - want['sop_logits']).abs().max():.3g}"
    # Today's default keeps padding out of the experts: the real tokens' logits are the same (the eval
    # capacity drops nothing here, and no real token reads a padding position), the padding's move.
    real = load_file(expected)["attention_mask"].bool()
    assert not real.all()
    assert torch.equal(got["masked.mlm_logits"][real], want["mlm_logits"][real])
    assert torch.equal(got["masked.sop_logits"], want["sop_logits"])
    assert not torch.equal(got["masked.mlm_logits"][~real], want["mlm_logits"][~real])


def test_image_folder_of_the_old_layout_gives_identical_logits(dist):
    expected = load_file(ASSETS / "legacy_image_expected_logits.safetensors")
    checkpoint = read_folder(IMAGE_ASSET)
    assert checkpoint.architecture == "ViTWideNetForImageClassification" and isinstance(checkpoint.config, VisionConfig)
    assert (checkpoint.config.hidden_size, checkpoint.config.num_classes) == (16, 5)
    model, report = load_pretrained(ViTWideNetForImageClassification, IMAGE_ASSET)
    assert not report.new and not report.unused and report.loaded == len(checkpoint.state)
    model.eval()
    with torch.no_grad():  # computed with the machine's own kernels: other CPUs differ by <= 1.5e-7 (assets/README)
        torch.testing.assert_close(model(expected["pixels"]).logits, expected["logits"], atol=1e-6, rtol=0)
