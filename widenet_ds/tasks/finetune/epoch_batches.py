"""Finetuning's training order: this rank's micro-batches of a dataset, shuffled epochs forever, resumable
at (epoch, samples consumed) on this shape or another."""

from __future__ import annotations

import torch

from widenet_ds.data.batch_order import GLOBAL_CHUNKS, BatchOrder
from widenet_ds.errors import DataError
from widenet_ds.formats import upgrade, versioned

LOADER_STATE = "loader_state.finetune"  # its kind in widenet_ds/formats.py


class EpochBatches:
    """This rank's micro-batches of `dataset`: epoch e visits `torch.randperm` keyed by seed + e (as
    `DistributedSampler`), cut into micro-batches by `BatchOrder` (data/batch_order.py)."""

    def __init__(self, dataset, micro_batch: int, seed: int, rank: int, world: int, accumulation: int = 1,
                 order: str = GLOBAL_CHUNKS) -> None:
        self.dataset, self.micro_batch, self.seed = dataset, micro_batch, seed
        self.order = BatchOrder(micro_batch, accumulation, rank, world, order)
        self.per_epoch = self.order.micro_batches_per_epoch(len(dataset))
        if self.per_epoch == 0:
            raise DataError(f"{len(dataset)} training examples cannot fill one step of {self.order.global_batch} "
                            f"(micro batch {micro_batch} x {accumulation} accumulation steps x {world} ranks); use "
                            f"more data or a smaller train_batch_size.")
        self.epoch, self.position = 0, 0  # micro-batches of `epoch` already handed out
        self._permutation: list[int] | None = None

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.position == self.per_epoch:
            self.epoch, self.position, self._permutation = self.epoch + 1, 0, None
        if self._permutation is None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            self._permutation = torch.randperm(len(self.dataset), generator=generator).tolist()
        rows = [self._permutation[p] for p in self.order.positions(self.position)]
        self.position += 1
        return self.dataset.collate([self.dataset[i] for i in rows])

    def state_dict(self) -> dict[str, int | str]:
        return versioned(LOADER_STATE, {"order": self.order.kind, "epoch": self.epoch,
                                        "consumed": self.order.consumed(self.position),
                                        "micro_batch_size": self.micro_batch})

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        # (a state of a version that did not record the order counted this shape's micro-batches)
        state = upgrade(LOADER_STATE, state, "the checkpoint's finetuning loader state",
                        assume={"micro_batch_size": self.micro_batch, "world_size": self.order.world})
        # (global chunks: a step takes the same samples with any micro batch of the same global batch)
        if state["order"] != self.order.kind or (self.order.kind != GLOBAL_CHUNKS
                                                 and state["micro_batch_size"] != self.micro_batch):
            raise DataError(f"loader state of the {state['order']} order with micro batch {state['micro_batch_size']} "
                            f"cannot continue in the {self.order.kind} order with micro batch {self.micro_batch}; "
                            f"resume with the run's batch settings")
        position = self.order.index_after(int(state["consumed"]), "the checkpoint's loader")
        if position > self.per_epoch:
            raise DataError(f"loader state position {state['consumed']} is past the epoch's "
                            f"{self.order.consumed(self.per_epoch)} samples; was it saved with other batch settings?")
        self.epoch, self.position, self._permutation = int(state["epoch"]), position, None
