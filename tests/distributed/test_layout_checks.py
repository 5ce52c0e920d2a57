"""The parallel layout's checks (distributed/layout_checks.py): expert parallelism against the world and the experts,
branch groups against the branches, the world and expert parallelism; made without torch, as `widenet-ds launch`
makes them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from widenet_ds.distributed.layout_checks import check_ep_size, check_layout
from widenet_ds.errors import ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.vision.config import VisionConfig

PARAFORMER = VisionConfig.from_preset("paraformer-tiny-3x4")
WIDENET = ModelConfig.from_preset("widenet-tiny-e4")


@pytest.mark.parametrize("world, ep, bp, model, message", [
    (2, 1, 2, WIDENET, r"--branch-parallel 2: the model has one branch"),
    (3, 1, 2, PARAFORMER, r"it does not divide the 3 rank\(s\)"),
    (4, 1, 4, PARAFORMER, r"the model has 3 branches, fewer than the 4 ranks of a branch group"),
    (4, 2, 2, VisionConfig.from_preset("widenet-paraformer-tiny-3x4"), r"--ep-size 2\) inside branch groups"),
    (3, 2, 1, WIDENET, r"--ep-size 2 does not divide the 3 rank"),
    (2, 2, 1, ModelConfig.from_preset("albert-tiny"), r"the model is dense"),
])
def test_layouts_that_cannot_work_are_refused_with_the_fix(world, ep, bp, model, message):
    with pytest.raises(ConfigError, match=message):
        check_layout(world, ep, bp, model)


def test_ep_size_must_divide_world_size_and_experts():
    check_ep_size(2, world_size=4, num_experts=8)
    check_ep_size(1, world_size=3, num_experts=None)
    with pytest.raises(ConfigError, match=r"--ep-size 4 does not divide the 2 rank\(s\); use one of \[1, 2\]"):
        check_ep_size(4, world_size=2, num_experts=4)
    with pytest.raises(ConfigError, match=r"--ep-size 2 does not divide the model's 3 experts"):
        check_ep_size(2, world_size=2, num_experts=3)
    with pytest.raises(ConfigError, match=r"the model is dense"):
        check_ep_size(2, world_size=2, num_experts=None)
    with pytest.raises(ConfigError, match=r"positive integer"):
        check_ep_size(0, world_size=2, num_experts=4)


def test_layouts_that_work_pass():
    check_layout(4, 2, 1, WIDENET)
    check_layout(4, 1, 2, PARAFORMER)
    check_layout(1, 1, 1, ModelConfig.from_preset("albert-tiny"))


def test_the_checks_import_neither_torch_nor_deepspeed():
    """`widenet-ds launch` makes them before any rank starts, in a process that never imports torch."""
    code = ("import sys; import widenet_ds.distributed.layout_checks, widenet_ds.model.config, "
            "widenet_ds.vision.config; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
