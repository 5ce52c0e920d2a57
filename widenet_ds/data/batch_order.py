"""Which positions of an epoch's shuffled stream each micro-batch of a rank holds.

`GLOBAL_CHUNKS` (every run since resuming on another shape exists): a step takes the next G = micro x
accumulation x data-parallel ranks positions of the stream, cut into chunks of `micro`; rank r's micro-batch at
accumulation step a is chunk a*W + r. Any shape with the same micro batch and global batch (W ranks x A steps,
W' x A' with W*A == W'*A') forms the same micro-batches of the same samples, so a micro-batch's loss mean and
its capacity routing do not depend on the shape, and a run continues on another one (`--resume`).

`RANK_STRIDED` (what checkpoints that record no order were written with): rank r takes positions r, r + W,
r + 2W, ... (`DistributedSampler`'s order); the micro-batches of a step then depend on W, and such a run
continues on its own shape only.

Both consume the stream from its start in whole steps, so "how far the epoch is" is the number of positions
consumed over all ranks: the loader state that means the same on any shape, and (global chunks) with any micro
batch of the same global batch: the next step takes the same samples, cut into other micro-batches.

How a step's micro-batches add up their per-token losses (the MLM loss; every other loss of our tasks is a mean
over examples, and every micro-batch holds as many): `LOSS_PER_MICRO_BATCH` (a new run, and every run before
another micro batch could continue one) averages each micro-batch's own mean; `LOSS_PER_STEP` (a run resumed
onto another micro batch, from there on) weighs each micro-batch's mean by its share of the step's counted tokens
over all micro-batches and ranks, so the step's loss is the mean over the step's tokens whatever the micro batch.
New runs keep the micro-batch means: their curves stay those of earlier versions (tests/assets/losses, measured
on several CPUs); the step counts would move them by up to ~1,800 float32 ulps in 20 steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.errors import DataError
from widenet_ds.formats import MICRO_BATCH_MEANS, RANK_STRIDED  # (named there: the upgrades of older
#                                                                   checkpoints fill them in)

GLOBAL_CHUNKS = "global-chunks"
ORDERS = (GLOBAL_CHUNKS, RANK_STRIDED)
LOSS_PER_STEP = "step-counts"
LOSS_PER_MICRO_BATCH = MICRO_BATCH_MEANS


@dataclass(frozen=True)
class BatchOrder:
    micro: int
    accumulation: int
    rank: int
    world: int  # data-parallel ranks
    kind: str = GLOBAL_CHUNKS

    def __post_init__(self) -> None:
        if self.kind not in ORDERS:
            raise DataError(f"unknown data order {self.kind!r}; known: {', '.join(ORDERS)}")
        if self.micro < 1 or self.accumulation < 1:
            raise DataError(f"micro batch {self.micro} and accumulation steps {self.accumulation} must be at least 1")
        if not 0 <= self.rank < self.world:
            raise DataError(f"rank {self.rank} is outside the world of {self.world} ranks")

    @property
    def global_batch(self) -> int:
        return self.micro * self.accumulation * self.world

    def micro_batches_per_epoch(self, stream_length: int) -> int:
        """This rank's micro-batches in an epoch of `stream_length` positions (the rest is dropped): whole steps
        of the global order, whole micro-batches per rank of the strided one."""
        if self.kind == GLOBAL_CHUNKS:
            return stream_length // self.global_batch * self.accumulation
        return stream_length // self.world // self.micro

    def positions(self, index: int) -> list[int]:
        """The stream positions of this rank's micro-batch `index` of an epoch."""
        if self.kind == GLOBAL_CHUNKS:
            step, accumulation_step = divmod(index, self.accumulation)
            start = step * self.global_batch + (accumulation_step * self.world + self.rank) * self.micro
            return list(range(start, start + self.micro))
        return [(index * self.micro + i) * self.world + self.rank for i in range(self.micro)]

    def consumed(self, index: int) -> int:
        """Positions consumed over all ranks once every rank has taken `index` micro-batches."""
        return index * self.micro * self.world

    def index_after(self, consumed: int, written_by: str) -> int:
        """The micro-batch index at which `consumed` positions have been taken (a loader state of `written_by`,
        which may have had another shape): it must fall on a step boundary of this order."""
        unit = self.global_batch if self.kind == GLOBAL_CHUNKS else self.micro * self.world
        if consumed % unit:
            raise DataError(f"{written_by} consumed {consumed} samples of its epoch, not a whole number of steps of "
                            f"{unit} samples here (micro batch {self.micro} x {self.accumulation} accumulation steps x "
                            f"{self.world} ranks); resume with the run's global batch size and micro batch size.")
        return consumed // (self.micro * self.world)
