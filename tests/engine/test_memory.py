"""DeepSpeed's bytes of a model per rank (engine/memory.py) against a real engine on one rank, summed from its
tensors (tests/support/engine_bytes.py): each ZeRO stage in fp32 and bf16, to the byte; DeepSpeed's layout rules
on a group of known sizes; the optimizer states against torch's own optimizers. Two ranks and expert parallelism:
tests/integration/test_dry_run_memory.py."""

from __future__ import annotations

import pytest
import torch

from tests.scripts.engine_memory import MICRO, SEQ, VOCAB, layout_config
from tests.support.engine_bytes import bytes_at_the_gradient_peak
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.engine.lamb import build_param_groups
from widenet_ds.engine.memory import (
    OPTIMIZER_STATE,
    ParamGroup,
    Unmodelled,
    model_state_bytes,
    zero_partition,
)
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining

pytestmark = pytest.mark.usefixtures("dist")


def settings(**config):
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "Lamb", "params": {}},
            "zero_allow_untested_optimizer": True, **config}
    return validate_ds_config(base, world_size=1, has_moe=False, cuda_available=False)


def test_a_one_rank_engine_holds_the_bytes_counted():
    for zero in (0, 1, 2):
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            model = WideNetForPreTraining(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB))
            ds = validate_ds_config(layout_config(zero, precision, 1), world_size=1, has_moe=True,
                                    cuda_available=False)
            groups = [ParamGroup(tuple(p.numel() for p in g["params"]), 1, 0, bool(g.get("moe")))
                      for g in build_param_groups(model, 0.01)]
            counted = model_state_bytes(groups, ds, "lamb")
            engine, _ = build_engine(model, ds)
            held = bytes_at_the_gradient_peak(engine, torch.Generator().manual_seed(0), MICRO, SEQ, VOCAB)
            assert held.pop("other") < 1024
            assert held == {"weights": counted.weights, "gradients": counted.gradients,
                            "master": counted.master_weights, "states": counted.optimizer_states}, (zero, precision)


def test_zero_pads_each_group_to_twice_its_ranks_and_the_last_partition_holds_the_padding():
    group = lambda place: ParamGroup((5, 7, 3), data_parallel_size=4, partition_id=place)  # noqa: E731
    # 15 elements padded to 16 (a multiple of 2 x 4): partitions of 4; rank 3's holds the tensor of 3 from offset 12
    assert [zero_partition(group(p), torch.bfloat16, False) for p in range(4)] == [
        (16, 4, 5), (16, 4, 5 + 7), (16, 4, 7), (16, 4, 3 + 1)]
    ds = settings(bf16={"enabled": True}, zero_optimization={"stage": 2, "reduce_bucket_size": 1000})
    last = model_state_bytes([group(3)], ds, "lamb")
    assert (last.weights, last.gradients, last.master_weights, last.optimizer_states) == (32, 8, 16, 32)
    assert last.reduce_buckets == 2000 and last.step_gradients == 4 * (4 + 2)


def test_a_layout_deepspeed_builds_otherwise_is_not_counted():
    with pytest.raises(Unmodelled, match="grad_accum_dtype fp32 with bf16"):
        model_state_bytes([ParamGroup((8,), 1, 0)], settings(bf16={"enabled": True}, zero_optimization={"stage": 1},
                                                             data_types={"grad_accum_dtype": "fp32"}), "lamb")


@pytest.mark.parametrize(("kind", "make"), [
    ("torch-adam", lambda params: torch.optim.AdamW(params, lr=0.1)),
    ("sgd-momentum", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)),
    ("lamb", lambda params: __import__("widenet_ds.engine.lamb", fromlist=["Lamb"]).Lamb(params, lr=0.1)),
])
def test_the_optimizer_states_counted_are_what_the_optimizer_keeps(kind, make):
    params = [torch.nn.Parameter(torch.randn(7, 3)), torch.nn.Parameter(torch.randn(5))]
    optimizer = make(params)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    kept = sum(v.untyped_storage().nbytes() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
    per_element, per_tensor = OPTIMIZER_STATE[kind]
    assert kept == per_element * 26 + per_tensor * 2
