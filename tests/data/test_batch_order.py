"""Which stream positions each rank's micro-batch holds (widenet_ds/data/batch_order.py): the global order
forms the same micro-batches on any shape with the same micro and global batch, the rank-strided order is
DistributedSampler's, and a loader state is taken back only on a step boundary."""

from __future__ import annotations

import pytest

from widenet_ds.data.batch_order import GLOBAL_CHUNKS, RANK_STRIDED, BatchOrder
from widenet_ds.errors import DataError


def step_batches(world: int, accumulation: int, step: int, kind: str = GLOBAL_CHUNKS, micro: int = 2) -> set:
    """The micro-batches (as position tuples) all ranks take in one optimizer step."""
    return {tuple(BatchOrder(micro, accumulation, rank, world, kind).positions(step * accumulation + a))
            for rank in range(world) for a in range(accumulation)}


def test_the_global_order_forms_the_same_micro_batches_on_any_shape():
    for step in range(3):
        shapes = [step_batches(world, 8 // world, step) for world in (1, 2, 4, 8)]
        assert all(batches == shapes[0] for batches in shapes)
        # a step takes the next 16 positions, in whole micro-batches of 2
        assert sorted(p for batch in shapes[0] for p in batch) == list(range(16 * step, 16 * step + 16))
    order = BatchOrder(micro=2, accumulation=2, rank=1, world=2)
    # chunk a*W + r: rank 1 takes chunks 1 and 3 of each step
    assert [order.positions(i) for i in range(4)] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_the_rank_strided_order_is_distributed_samplers():
    order = BatchOrder(micro=3, accumulation=1, rank=1, world=4, kind=RANK_STRIDED)
    assert order.positions(0) == [1, 5, 9] and order.positions(1) == [13, 17, 21]
    # its micro-batches depend on the shape: 2 ranks x 2 steps group the positions otherwise than 4 x 1
    assert step_batches(2, 2, 0, RANK_STRIDED) != step_batches(4, 1, 0, RANK_STRIDED)


def test_an_epoch_holds_whole_steps_and_the_rest_is_dropped():
    assert BatchOrder(2, 2, 0, 2).micro_batches_per_epoch(17) == 2 * 2  # 17 // 8 steps x 2 accumulation steps
    assert BatchOrder(2, 2, 0, 2).micro_batches_per_epoch(7) == 0
    assert BatchOrder(2, 1, 0, 3, RANK_STRIDED).micro_batches_per_epoch(17) == 2  # 17 // 3 // 2


def test_a_loader_state_resumes_on_another_shape_only_at_a_step_boundary():
    written = BatchOrder(micro=2, accumulation=1, rank=0, world=4)
    consumed = written.consumed(6)  # 6 micro-batches per rank, 4 ranks: 48 positions
    assert consumed == 48
    other = BatchOrder(micro=2, accumulation=4, rank=0, world=1)  # same global batch 8
    assert other.index_after(consumed, "the run") == 24
    assert other.positions(24) == written.positions(6)[:2] == [48, 49]
    with pytest.raises(DataError, match="the run consumed 44 samples of its epoch, not a whole number of steps of 8"):
        other.index_after(44, "the run")


@pytest.mark.parametrize(("args", "message"), [
    ((2, 1, 0, 1, "sorted"), "unknown data order 'sorted'"),
    ((0, 1, 0, 1), "micro batch 0 and accumulation steps 1 must be at least 1"),
    ((2, 0, 0, 1), "must be at least 1"),
    ((2, 1, 2, 2), "rank 2 is outside the world of 2 ranks"),
    ((2, 1, -1, 2), "rank -1 is outside")])
def test_impossible_orders_are_refused(args, message):
    with pytest.raises(DataError, match=message):
        BatchOrder(*args)
