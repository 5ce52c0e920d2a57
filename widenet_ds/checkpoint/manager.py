"""Saving and resuming a training run's checkpoints: save every N steps, keep the last K, resume exactly
(checkpoint/tags.py names the tags and resolves them).

A tag is written as `step120.partial/` and renamed to `step120/` once complete, so a crash or a full disk
never leaves a folder that looks like a checkpoint (DeepSpeed's `load_checkpoint(dir, tag)` only joins
`dir/tag/`: the files read the same after the rename). Before writing, rank 0 checks the free space against
the last checkpoint's size (or an estimate from the parameter count); a write that fails on any rank
anyway is removed on every rank and stops the run with one error, the last complete checkpoint intact.
DeepSpeed's own `latest` is written by rank 0 before the other ranks are known to be done and not
atomically, so we save with `save_latest=False` and write it ourselves after the rename.
Old tags are deleted only after the new one is complete.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from deepspeed.moe.utils import is_moe_param

from widenet_ds.checkpoint.marker import LATEST_FILE, META_FILE, CheckpointMeta
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tags import (
    PARTIAL,
    TAG,
    complete_tags,
    latest_checkpoint,
    rank_file,
    tag_for,
)
from widenet_ds.distributed.groups import all_values, barrier, rank0_value
from widenet_ds.errors import CheckpointError, mark_same_on_every_rank
from widenet_ds.fs.atomic import atomic_write_text
from widenet_ds.fs.checksums import record_files, total_size
from widenet_ds.fs.disk_space import (
    DiskFullError,
    check_free_space,
    free_bytes,
    is_disk_full,
    mib,
    needed_bytes,
)

OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weight + two moments (Adam, LAMB), saved by every ZeRO stage


@dataclass
class TrainingState:
    """Counters that continue across a resume."""

    step: int = 0  # optimizer steps done
    samples: int = 0  # training samples consumed over all ranks


def rng_state() -> dict[str, Any]:
    """Every generator the training step draws from on this rank (MoE gate noise and dropout use
    torch's global generator)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def estimate_checkpoint_bytes(module: torch.nn.Module, ep_size: int) -> int:
    """A checkpoint's size before the first one is written: each weight in its dtype plus the optimizer's
    fp32 master copy and two moments. This rank's module holds 1/ep_size of the experts (the parameters
    DeepSpeed's MoE layer marks as its own: they are not all-reduced over data parallel ranks)."""
    total = 0
    for param in module.parameters():
        copies = ep_size if is_moe_param(param) else 1
        total += copies * param.numel() * (param.element_size() + OPTIMIZER_BYTES_PER_PARAM)
    return total


class CheckpointManager:
    """Saves and loads complete checkpoints of a DeepSpeed engine plus our per-rank state."""

    def __init__(self, checkpoint_dir: Path, keep_last: int, rank: int, world_size: int) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self.keep_last = keep_last
        self.rank = rank
        self.world_size = world_size
        self.expected_bytes: int | None = None  # the last checkpoint's size (else estimated from the model)

    # -- space -----------------------------------------------------------------------------------------
    def expect(self, engine, ep_size: int, meta: CheckpointMeta | None = None) -> None:
        """What the next checkpoint will take: the resumed one's size, else an estimate from the model."""
        self.expected_bytes = (total_size(meta.files) if meta is not None and meta.files
                               else estimate_checkpoint_bytes(engine.module, ep_size))

    def check_space(self, what: str, fix: str) -> None:
        """Collective: stop every rank with one error when rank 0 finds too little space for a checkpoint."""
        problem = None
        if self.rank == 0 and self.expected_bytes is not None:
            try:
                check_free_space(self.checkpoint_dir, self.expected_bytes, what, fix)
            except DiskFullError as err:
                problem = str(err)
        problem = rank0_value(problem)
        if problem:
            raise mark_same_on_every_rank(DiskFullError(problem))

    def _resume_hint(self) -> str:
        latest = latest_checkpoint(self.checkpoint_dir) if (self.checkpoint_dir / LATEST_FILE).is_file() else None
        # Pruning follows a complete save: a lower --keep-last would free nothing for this one.
        older = [tag for tag in complete_tags(self.checkpoint_dir) if latest is None or tag != latest.name]
        deletable = (f" (deleting the older checkpoints {', '.join(older)} frees some; --keep-last removes them only "
                     f"after a new checkpoint is complete)" if older else "")
        return (f"The last complete checkpoint is {latest}: free at least {mib(needed_bytes(self.expected_bytes or 0))} "
                f"in {self.checkpoint_dir}{deletable}, then continue with --resume."
                if latest else f"No checkpoint of this run is saved yet: free at least "
                               f"{mib(needed_bytes(self.expected_bytes or 0))} in {self.checkpoint_dir} (or choose "
                               f"an --output-dir on a disk with more space) and start the run again.")

    # -- save ------------------------------------------------------------------------------------------
    def save(self, engine, state: TrainingState, loader, meta: CheckpointMeta) -> Path:
        """Collective (all ranks). `meta` (its step and samples set here) is the tag's marker, written last."""
        tag = tag_for(state.step)
        final, partial = self.checkpoint_dir / tag, self.checkpoint_dir / f"{tag}{PARTIAL}"
        if self.rank == 0:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # left by an attempt that crashed while writing
        self.check_space(f"the checkpoint of step {state.step}", f"The run stopped at step {state.step} without "
                                                                  f"saving it. {self._resume_hint()}")
        failure = None
        try:
            partial.mkdir(parents=True, exist_ok=True)
            torch.save({"loader": loader.state_dict(), "rng": rng_state(), "step": state.step},
                       rank_file(partial, self.rank))
        except Exception as err:
            failure = err
        self._agree(failure, partial, state.step)
        try:
            # Ends with a barrier: every rank's files are written when it returns. Its writes hold no
            # collective after the tag check, so a rank whose write failed meets the others at that barrier.
            engine.save_checkpoint(str(self.checkpoint_dir), tag=partial.name, save_latest=False)
        except Exception as err:
            failure = err
            barrier()
        self._agree(failure, partial, state.step)
        if self.rank == 0:
            try:
                files = record_files(partial)
                marker = dataclasses.replace(meta, step=state.step, samples=state.samples,
                                             world_size=self.world_size, files=files)
                marker.write(partial)
                self._move_into_place(partial, final)
                atomic_write_text(self.checkpoint_dir / LATEST_FILE, tag)
                self.expected_bytes = total_size(files)
            except Exception as err:
                failure = err
        self._agree(failure, partial, state.step)
        if self.rank == 0:
            self._prune(current_step=state.step)
        barrier()
        return final

    @staticmethod
    def _move_into_place(partial: Path, final: Path) -> None:
        if final.exists():  # the same step saved by an earlier attempt of this run (resumed from before it)
            old = final.with_name(f"{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old)
        else:
            os.replace(partial, final)

    def _agree(self, failure: BaseException | None, partial: Path, step: int) -> None:
        """Collective: when the write failed on any rank, remove the partial tag and raise one error on all."""
        problem = None
        if failure is not None:
            full = is_disk_full(failure, self.checkpoint_dir)
            problem = (f"rank {self.rank}: {'the disk is full' if full else 'writing failed'} "
                       f"({type(failure).__name__}: {str(failure).strip()[:300]}; {mib(free_bytes(self.checkpoint_dir))} "
                       f"free)", full)
        problems = all_values(problem)
        if not problems:
            return
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        barrier()
        full = any(is_full for _, is_full in problems)
        listed = "; ".join(text for text, _ in problems)
        cause = (f"there is not enough space in {self.checkpoint_dir} (about "
                 f"{mib(needed_bytes(self.expected_bytes or 0))} needed)" if full else "a rank could not write it")
        error = (DiskFullError if full else CheckpointError)(
            f"the checkpoint of step {step} could not be saved: {cause} [{listed}]. Its partial files were "
            f"removed and the run stopped at step {step}. {self._resume_hint()}")
        raise mark_same_on_every_rank(error)

    def _prune(self, current_step: int) -> None:
        """Keep the newest `keep_last` complete tags up to now; drop older ones, partial ones, and tags
        beyond `current_step` left by an interrupted earlier attempt of this run."""
        tags = []
        for child in self.checkpoint_dir.iterdir():
            match = TAG.match(child.name.removesuffix(PARTIAL).removesuffix(".old"))
            if match and child.is_dir():
                tags.append((int(match.group(1)), child))
        complete = sorted((step, d) for step, d in tags
                          if step <= current_step and TAG.match(d.name) and (d / META_FILE).is_file())
        keep = {d for _, d in complete[-self.keep_last:]}
        for _, tag_dir in tags:
            if tag_dir not in keep:
                shutil.rmtree(tag_dir)

    def load(self, engine, source: CheckpointSource, loader) -> TrainingState:
        """Collective. Restores engine (weights, optimizer, schedule), loader and RNG of this rank from `source`,
        opened for --resume (its files checked on every rank)."""
        tag_dir, meta = source.tag_dir, source.meta
        if meta.world_size != self.world_size:
            raise CheckpointError(f"checkpoint {tag_dir} was written by {meta.world_size} ranks, this run has "
                                  f"{self.world_size}; an exact resume needs the same number of ranks (the data "
                                  f"order and ZeRO partitions depend on it).")
        load_path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
        if load_path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint files in {tag_dir}.")
        rank_state = torch.load(rank_file(tag_dir, self.rank), weights_only=True)
        loader.load_state_dict(rank_state["loader"])
        set_rng_state(rank_state["rng"])
        if engine.global_steps != meta.step:
            raise CheckpointError(f"checkpoint {tag_dir}: DeepSpeed restored global step {engine.global_steps}, "
                                  f"our marker says {meta.step}; the checkpoint folder is inconsistent.")
        return TrainingState(step=meta.step, samples=meta.samples)


def load_weights_only(engine, tag_dir: Path) -> None:
    """Start a new phase from another run's weights: no optimizer, schedule, loader or RNG state."""
    engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=False,
                           load_lr_scheduler_states=False, load_module_only=True)
