"""A portable folder written by the pre-restructuring code (tests/assets/README.md) still loads, with
the logits that code computed from it. Computed in a child process with portable arithmetic
(tests/portable_arithmetic.py), so the comparison stays exact on any x86-64 CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from launching import REPO
from portable_arithmetic import run_portable_python

ASSETS = Path(__file__).parent / "assets"
LEGACY_LOGITS = REPO / "tests" / "scripts" / "legacy_logits.py"


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
