"""Finetuning's data order: DistributedSampler's permutations, cut by BatchOrder, resumed at (epoch, consumed)."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.data.batch_order import RANK_STRIDED
from widenet_ds.errors import DataError
from widenet_ds.tasks.finetune.epoch_batches import EpochBatches


class _Rows(torch.utils.data.Dataset):
    pad_id = 0

    def __len__(self):
        return 22

    def __getitem__(self, i):
        return i

    def collate(self, items):
        return torch.tensor(items)


def test_the_rank_strided_order_is_the_sampler_order_and_resumes_at_epoch_and_position():
    """Checkpoints of earlier versions: the micro-batches are DistributedSampler's epochs (what a DataLoader
    over it gives), and a copy restored from a state of that version continues with exactly the same batches,
    across epoch ends."""
    dataset = _Rows()
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5,
                                                  drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=dataset.collate,
                                         drop_last=True)
    expected = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected += [batch.tolist() for batch in loader]
    batches = EpochBatches(dataset, 4, seed=5, rank=1, world=2, order=RANK_STRIDED)
    got = [next(batches).tolist() for _ in range(4)]
    assert batches.state_dict()["consumed"] == 16  # 11 rows per rank -> 2 micro-batches per epoch
    restored = EpochBatches(dataset, 4, seed=5, rank=1, world=2, order=RANK_STRIDED)
    restored.load_state_dict({"epoch": 1, "position": 2})  # as that version wrote it
    got += [next(restored).tolist() for _ in range(2)]
    assert got == expected[:6] and len(expected) == 6


def step_batches(world: int, accumulation: int, steps: int, skip: int = 0) -> list[list[list[int]]]:
    """The micro-batches (sorted rows) of `steps` steps after `skip` steps, on `world` ranks."""
    ranks = [EpochBatches(_Rows(), 2, seed=5, rank=r, world=world, accumulation=accumulation) for r in range(world)]
    for loader in ranks:
        loader.load_state_dict({"order": "global-chunks", "epoch": skip // 2, "micro_batch_size": 2,
                                "consumed": skip % 2 * 8})
    out = []
    for _ in range(steps):
        per_rank = [[sorted(next(loader).tolist()) for _ in range(accumulation)] for loader in ranks]
        out.append(sorted(batch for rank in per_rank for batch in rank))
    return out


def test_a_step_holds_the_same_micro_batches_on_any_shape_and_resumes_on_another():
    """Global chunks: 1 rank x 4 accumulation steps, 2 x 2 and 4 x 1 form the same micro-batches of 2 in each
    step of 8, across the epoch end (22 rows: 2 steps an epoch); a state of 2 ranks continues on 4."""
    reference = step_batches(1, 4, 5)
    assert step_batches(2, 2, 5) == reference == step_batches(4, 1, 5)
    assert step_batches(4, 1, 2, skip=3) == reference[3:5]
    two = EpochBatches(_Rows(), 2, seed=5, rank=0, world=2, accumulation=2)
    for _ in range(4):
        next(two)
    three = EpochBatches(_Rows(), 2, seed=5, rank=0, world=3, accumulation=1)
    with pytest.raises(DataError, match="not a whole number of steps of 6"):
        three.load_state_dict(two.state_dict())
    with pytest.raises(DataError, match="past the epoch"):
        two.load_state_dict({**two.state_dict(), "consumed": 24})
    # another micro batch of the same global batch (8 = 4 x 2 ranks): the next step's samples, cut otherwise
    four = EpochBatches(_Rows(), 4, seed=5, rank=0, world=2)
    four.load_state_dict(two.state_dict())
    assert (four.epoch, four.position) == (0, 2)  # the end of epoch 0: 2 steps of 8
