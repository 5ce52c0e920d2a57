"""The preflight's steps (launch/preflight_steps.py): its tolerance is the golden curves', the tiny batches are the
same in every process, and how the losses, step times and MFU are judged and said. The tiny model and the job's steps
on real ranks: tests/launch/test_preflight_rank.py and tests/integration/test_two_nodes.py."""

from __future__ import annotations

import numpy as np
import torch

from tests.support.golden_curves import TOLERANCE_ULPS
from widenet_ds.launch.preflight_steps import (
    LOSS_TOLERANCE_ULPS,
    TINY_STEPS,
    JobSteps,
    TinyLayout,
    mfu_words,
    peak_tflops,
    routing_row,
    tiny_batch,
    tiny_model_config,
)
from widenet_ds.model.config import ModelConfig

LAYOUT = TinyLayout(world=2, ep_size=2, num_experts=4)


def test_the_tolerance_is_the_golden_curves():
    assert LOSS_TOLERANCE_ULPS == TOLERANCE_ULPS


def test_a_tiny_micro_batch_is_the_same_everywhere_and_every_one_masks_as_many_tokens():
    first, again = tiny_batch(1, 3, "cpu"), tiny_batch(1, 3, "cpu")
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["input_ids"], tiny_batch(1, 2, "cpu")["input_ids"])
    counts = {int((tiny_batch(s, i, "cpu")["mlm_labels"] != -100).sum()) for s in range(3) for i in range(4)}
    assert counts == {int((first["mlm_labels"] != -100).sum())}
    moe = tiny_model_config(8).moe
    assert (moe.num_experts, moe.noise, moe.dispatch) == (8, "none", "deepspeed")


def losses(base: float, *, off: dict[tuple[int, int], int] | None = None) -> list[list[float]]:
    """Per step, per rank: `base` + step, moved by `off[(step, rank)]` float32 ulps."""
    rows = []
    for step in range(TINY_STEPS):
        row = []
        for rank in range(LAYOUT.world):
            value = np.float32(base + step)
            for _ in range((off or {}).get((step, rank), 0)):
                value = np.nextafter(value, np.float32(np.inf))
            row.append(float(value))
        rows.append(row)
    return rows


def test_losses_within_the_tolerance_pass_and_beyond_it_name_the_ranks_and_nodes():
    reference = losses(5.0)
    assert routing_row(LAYOUT, losses(5.0, off={(1, 0): LOSS_TOLERANCE_ULPS}), reference, ["node1", "node2"]).passed
    row = routing_row(LAYOUT, losses(5.0, off={(1, 1): 300, (2, 1): 40}), reference, ["node1", "node2"])
    assert not row.passed and row.nodes == ("node2",)
    assert "the losses of rank 1 on node2 differ from a one-rank run's from step 2 on by up to 300 ulps" in row.found


def test_mfu_is_said_against_a_known_gpus_peak_only():
    model = ModelConfig.from_preset("widenet-base-e8")
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A10") is None
    assert mfu_words(model, 128, 1e6, 16, "CPU", "bf16") == "MFU: no peak known for CPUs"
    assert mfu_words(model, 128, 1e6, 16, "NVIDIA A10", "bf16").startswith("MFU: no peak known for NVIDIA A10")
    words = mfu_words(model, 128, 1e6, 16, "NVIDIA H100 80GB HBM3", "bf16")
    assert words.startswith("MFU ") and words.endswith("of the NVIDIA H100 80GB HBM3's 989 TFLOP/s (bf16)")
    assert JobSteps([0.5], 2.0, 128, True, 1).restored is None  # no checkpoint taken unless asked
