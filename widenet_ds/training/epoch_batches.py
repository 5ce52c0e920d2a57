"""Finetuning's training order: this rank's micro-batches of a dataset, shuffled epochs forever, resumable
at (epoch, position)."""

from __future__ import annotations

import torch

from widenet_ds.errors import DataError


class EpochBatches:
    """This rank's micro-batches of `dataset`: shuffled epochs forever (DistributedSampler's order, a new one
    each epoch), resumable at (epoch, position) without touching the skipped examples."""

    def __init__(self, dataset, micro_batch: int, seed: int, rank: int, world: int) -> None:
        self.dataset, self.micro_batch = dataset, micro_batch
        self.sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                                           seed=seed, drop_last=True)
        self.per_epoch = len(self.sampler) // micro_batch
        if self.per_epoch == 0:
            raise DataError(f"{len(dataset)} training examples cannot fill one micro-batch of {micro_batch} on each "
                            f"of {world} ranks; use more data or a smaller train_micro_batch_size_per_gpu.")
        self.epoch, self.position = 0, 0  # micro-batches of `epoch` already handed out
        self._order: list[int] | None = None

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.position == self.per_epoch:
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        if self._order is None:
            self.sampler.set_epoch(self.epoch)
            self._order = list(self.sampler)
        rows = self._order[self.position * self.micro_batch:(self.position + 1) * self.micro_batch]
        self.position += 1
        return self.dataset.collate([self.dataset[i] for i in rows])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self._order = int(state["epoch"]), int(state["position"]), None
