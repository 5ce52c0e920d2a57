"""Distributed prediction for finetuning: every example scored exactly once, gathered in dataset order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as torch_dist

from widenet_ds.distributed.console import say


@dataclass
class Prepared:
    """A task's data for one run: what to train on, what each evaluation split needs, and one line per
    notable fact about it (sizes, skipped rows) for the run's log."""

    train: Any
    evals: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _gather_in_order(local: dict[int, np.ndarray], total: int) -> list[np.ndarray]:
    """Per-example outputs computed on every rank -> one list in dataset order, on every rank."""
    parts: list[dict[int, np.ndarray]] = [None] * torch_dist.get_world_size()  # type: ignore[list-item]
    torch_dist.all_gather_object(parts, local)
    merged: dict[int, np.ndarray] = {}
    for part in parts:
        merged.update(part)
    assert len(merged) == total, (len(merged), total)
    return [merged[i] for i in range(total)]


@dataclass(frozen=True)
class Batching:
    """How micro-batches are shaped. Expert parallelism (ep_size > 1) exchanges capacity buffers sized by
    each rank's token count in one all-to-all, so every rank must then feed the same [micro_batch, pad_to]
    shape; otherwise batches are padded only to their longest member."""

    micro_batch: int
    pad_to: int | None = None

    def shape(self, batch: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
        if self.pad_to is None:
            return batch
        extra = self.pad_to - batch["input_ids"].shape[1]
        assert extra >= 0, (self.pad_to, batch["input_ids"].shape)
        fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0}
        return {k: torch.nn.functional.pad(v, (0, extra), value=fill[k]) if k in fill else v for k, v in batch.items()}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


class Progress:
    """Lines while a long prediction runs (SQuAD's dev set: minutes on a CPU): nothing for a short one; else, after
    the first forward, how many examples and about how long, then every `every` seconds how far, and the end."""

    def __init__(self, total: int, steps: int, world: int, *, long_s: float = 20.0, every: float = 30.0,
                 say: Callable[[str], None] = say) -> None:
        self.total, self.steps, self.world, self.long_s, self.every, self.say = total, steps, world, long_s, every, say
        self.start = time.monotonic()
        self.shown = False
        self.last = self.start

    def step(self, done_steps: int) -> None:
        now = time.monotonic()
        left = (now - self.start) / done_steps * (self.steps - done_steps)
        done = min(self.total, round(self.total * done_steps / self.steps))
        if not self.shown:
            if left > self.long_s:
                self.say(f"evaluating {self.total:,} examples on {self.world} rank(s): about {_duration(left)}")
                self.shown, self.last = True, now
        elif now - self.last >= self.every and done_steps < self.steps:
            self.say(f"evaluating: {done:,} of {self.total:,} examples ({100 * done_steps // self.steps}%), about "
                     f"{_duration(left)} left")
            self.last = now

    def end(self) -> None:
        if self.shown:
            self.say(f"evaluated {self.total:,} examples in {_duration(time.monotonic() - self.start)}")


def predict(engine, dataset, batching: Batching, outputs: tuple[str, ...]) -> dict[str, list[np.ndarray]]:
    """Run the model over `dataset`, each example exactly once (ranks take strided shards); a long one says how
    far it is (`Progress`, rank 0)."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    micro_batch = batching.micro_batch
    mine = list(range(rank, len(dataset), world))
    # Every rank runs the same number of forwards (the MoE all-to-all is collective): a short chunk is
    # filled up with example 0, whose outputs there are dropped, so nothing is scored twice.
    steps = -(-(-(-len(dataset) // world)) // micro_batch)
    results: dict[str, dict[int, np.ndarray]] = {name: {} for name in outputs}
    progress = Progress(len(dataset), steps, world)
    engine.eval()
    with torch.no_grad():
        for step in range(steps):
            if step:
                progress.step(step)
            chunk = mine[step * micro_batch:(step + 1) * micro_batch]
            rows = chunk + [0] * ((micro_batch if batching.pad_to else 1) - len(chunk))
            batch = batching.shape(dataset.collate([dataset[i] for i in rows]), dataset.pad_id)
            out = engine(**{k: batch[k].to(engine.device) for k in ("input_ids", "token_type_ids", "attention_mask")})
            for name in outputs:
                values = getattr(out, name).float().cpu().numpy()
                results[name].update((index, values[row]) for row, index in enumerate(chunk))
    progress.end()
    engine.train()
    return {name: _gather_in_order(values, len(dataset)) for name, values in results.items()}


