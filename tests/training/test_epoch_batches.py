"""Finetuning's data order: DistributedSampler's epochs, resumed at (epoch, position)."""

from __future__ import annotations

import torch

from widenet_ds.training.epoch_batches import EpochBatches


class _Rows(torch.utils.data.Dataset):
    pad_id = 0

    def __len__(self):
        return 22

    def __getitem__(self, i):
        return i

    def collate(self, items):
        return torch.tensor(items)


def test_data_order_is_the_sampler_order_and_resumes_at_epoch_and_position():
    """The micro-batches are DistributedSampler's epochs (what a DataLoader over it gives), and a copy
    restored from a state taken mid-run continues with exactly the same batches, across epoch ends."""
    dataset = _Rows()
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5,
                                                  drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=dataset.collate,
                                         drop_last=True)
    expected = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected += [batch.tolist() for batch in loader]
    batches = EpochBatches(dataset, 4, seed=5, rank=1, world=2)
    got = [next(batches).tolist() for _ in range(4)]
    state = batches.state_dict()
    assert state == {"epoch": 1, "position": 2}  # 11 rows per rank -> 2 micro-batches per epoch
    restored = EpochBatches(dataset, 4, seed=5, rank=1, world=2)
    restored.load_state_dict(state)
    got += [next(restored).tolist() for _ in range(2)]
    assert got == expected[:6] and len(expected) == 6
