"""Portable folders written by earlier code (tests/assets/README.md) still load, with the logits that code
computed from them (within LOGITS_ATOL: other CPUs' kernels move a logit by up to 1.4e-7, a weight loaded
wrongly by orders of magnitude more): a text folder of the pre-restructuring code, computed in a child process;
and an image folder of the layout `python -m widenet_ds.vision.export` wrote (its config under "vision_model")
before the image model joined the shared folder format. Both are folders of format version 1, read through
widenet_ds/formats.py's upgrade to version 2."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.support.launching import REPO, child_env
from widenet_ds.checkpoint.source import load_pretrained
from widenet_ds.formats import current
from widenet_ds.portable.format import read_folder, read_folder_config
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

ASSETS = REPO / "tests" / "assets"
TEXT_ASSET = ASSETS / "legacy_folder"
LEGACY_LOGITS = REPO / "tests" / "scripts" / "legacy_logits.py"
IMAGE_ASSET = ASSETS / "legacy_image_folder"
# Measured (tests/assets/README.md): the stored logits and this code's on an AMD EPYC with its own kernels differ
# by up to 1.35e-7 (the logits are up to 0.34); keeping padding out of the experts moves padding's by 4e-3.
LOGITS_ATOL = 1e-6


def test_folder_of_the_old_layout_gives_identical_logits(tmp_path):
    expected = ASSETS / "legacy_expected_logits.safetensors"
    out = tmp_path / "logits.safetensors"
    subprocess.run([sys.executable, str(LEGACY_LOGITS), str(expected), str(out)], cwd=REPO, env=child_env(),
                   check=True, timeout=120)
    with safe_open(out, "pt") as f:
        report = json.loads(f.metadata()["report"])
    assert report == {"new": [], "unused": [], "saved_ep_size": 2}
    got, want = load_file(out), load_file(expected)
    torch.testing.assert_close(got["mlm_logits"], want["mlm_logits"], atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(got["sop_logits"], want["sop_logits"], atol=LOGITS_ATOL, rtol=0)
    # Today's default keeps padding out of the experts: the real tokens' logits are the same (the eval
    # capacity drops nothing here, and no real token reads a padding position), the padding's move.
    real = load_file(expected)["attention_mask"].bool()
    assert not real.all()
    torch.testing.assert_close(got["masked.mlm_logits"][real], want["mlm_logits"][real], atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(got["masked.sop_logits"], want["sop_logits"], atol=LOGITS_ATOL, rtol=0)
    assert (got["masked.mlm_logits"][~real] - want["mlm_logits"][~real]).abs().max() > 100 * LOGITS_ATOL


def test_image_folder_of_the_old_layout_gives_identical_logits(dist):
    expected = load_file(ASSETS / "legacy_image_expected_logits.safetensors")
    checkpoint = read_folder(IMAGE_ASSET)
    assert checkpoint.architecture == "ViTWideNetForImageClassification" and isinstance(checkpoint.config, VisionConfig)
    assert (checkpoint.config.hidden_size, checkpoint.config.num_classes) == (16, 5)
    model, report = load_pretrained(ViTWideNetForImageClassification, IMAGE_ASSET)
    assert not report.new and not report.unused and report.loaded == len(checkpoint.state)
    model.eval()
    with torch.no_grad():  # computed with the machine's own kernels: other CPUs differ by <= 1.5e-7 (assets/README)
        torch.testing.assert_close(model(expected["pixels"]).logits, expected["logits"], atol=LOGITS_ATOL, rtol=0)


def test_the_old_folders_configs_are_upgraded_as_their_readers_read_them():
    stored = {name: json.loads((ASSETS / name / "config.json").read_text())
              for name in ("legacy_folder", "legacy_image_folder")}
    assert {config["format_version"] for config in stored.values()} == {1}
    text = read_folder_config(TEXT_ASSET)
    assert text["format_version"] == current("folder") and text["files"] == {}  # no checksums recorded then
    # 0.1's run settings leave the model config: the ep_size trained with is provenance, activation
    # checkpointing is dropped
    old = json.loads(json.dumps(stored["legacy_folder"]["model"]))
    del old["activation_checkpointing"], old["moe"]["ep_size"]
    assert text["model"] == old
    assert text["provenance"] == {**stored["legacy_folder"]["provenance"], "trained_with_ep_size": 2}
    assert (text["num_labels"], text["dtype"]) == (None, "fp32")
    image = read_folder_config(IMAGE_ASSET)
    assert image["model"] == stored["legacy_image_folder"]["vision_model"] and "vision_model" not in image
    assert (image["num_labels"], image["dtype"], image["files"]) == (None, "fp32", {})
    assert read_folder(TEXT_ASSET).provenance["trained_with_ep_size"] == 2
