"""The dry run's bytes per rank (launch/dry_run.py `model_states`: DeepSpeed's partitioning by engine/memory.py)
against what real engines hold, summed from their tensors (tests/support/engine_bytes.py), on 2 launched ranks:
each ZeRO stage in fp32 and bf16, ep 1 and 2, equal to the byte."""

from __future__ import annotations

import json

import pytest

from tests.scripts.engine_memory import MICRO, VOCAB, layout_config
from tests.support.launching import REPO, run_deepspeed
from widenet_ds.engine.build import plan_optimizer
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.launch.job_memory import model_states
from widenet_ds.launch.job_shape import JobShape
from widenet_ds.model.config import ModelConfig

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

# Every stage in both precisions, ep 1 and 2 among them: one launch of 2 ranks (about 20 s)
LAYOUTS = ("0:fp32:2", "0:bf16:1", "1:fp32:2", "1:bf16:2", "2:fp32:1", "2:bf16:2")
OTHER_BYTES = 1024  # DeepSpeed's scalars (the gradient norm, loss scale), counted by neither side


def predicted(layout: str, world: int) -> list[dict[str, int]]:
    zero, precision, ep = layout.split(":")
    ds = validate_ds_config(layout_config(int(zero), precision, world), world_size=world, has_moe=True,
                            cuda_available=False)
    shape = JobShape.even(1, world, ep_size=int(ep), num_experts=4)
    states = model_states(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB), shape, ds,
                          plan_optimizer(ds, "auto", cuda_available=False).implementation, gpus=False)
    return [{"weights": s.weights, "gradients": s.gradients, "master": s.master_weights, "states": s.optimizer_states}
            for s in states]


def test_the_dry_runs_bytes_per_rank_are_what_two_launched_engines_hold(tmp_path):
    run_deepspeed(REPO / "tests/scripts/engine_memory.py", [str(tmp_path / "bytes"), *LAYOUTS], num_ranks=2)
    for rank in range(2):
        measured = json.loads((tmp_path / f"bytes.rank{rank}.json").read_text())
        for layout in LAYOUTS:
            held = measured[layout]
            assert held.pop("other") < OTHER_BYTES, (layout, rank)
            assert held == predicted(layout, 2)[rank], (layout, rank, MICRO)
