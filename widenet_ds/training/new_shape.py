"""A resume on another shape (ranks, expert-parallel size, ZeRO stage): what must hold, checked before anything
loads. The checkpoint is then read whole and put into this run's engine (checkpoint/shape_free.py); the step it
continues with computes the same thing as on the old shape because the micro-batches of a step do not depend on
the shape (data/batch_order.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.data.batch_order import GLOBAL_CHUNKS
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.runtime.ds_config import DeepSpeedSettings, validate_ds_config
from widenet_ds.runtime.parallel import ParallelPlan


@dataclass(frozen=True)
class Shape:
    world_size: int
    ep_size: int
    zero_stage: int

    def __str__(self) -> str:
        return (f"{self.world_size} rank{'s' if self.world_size != 1 else ''}, ep {self.ep_size}, "
                f"ZeRO {self.zero_stage}")


def trained_world_size(meta: CheckpointMeta) -> int:
    """The ranks the checkpoint's run trained on (a resharded tag records the new ones, and where it came from)."""
    return (meta.run.get("resharded_from") or {}).get("world_size") or meta.world_size


def saved_settings(meta: CheckpointMeta, has_moe: bool) -> DeepSpeedSettings | None:
    """The checkpoint's DeepSpeed settings as its run resolved them (None: a marker that did not record them)."""
    if not meta.deepspeed_config:
        return None
    return validate_ds_config(meta.deepspeed_config, world_size=trained_world_size(meta), has_moe=has_moe,
                              cuda_available=torch.cuda.is_available())


def shape_words(new_shape: str) -> str:
    """How the console and the log say a re-laid-out resume: on another shape, or a resharded checkpoint on the
    shape it was resharded for."""
    old, _, new = new_shape.partition(" -> ")
    return (f"on another shape ({new_shape})" if old != new else
            f"re-laid out from its resharded state (on its own shape, {new})")


def check_micro_batches_divide(checkpoint: CheckpointSource, data_parallel_size: int, has_moe: bool) -> None:
    """A resume on ranks that cannot split the checkpoint's micro-batches of a step: its message first (the
    DeepSpeed JSON's batch arithmetic would otherwise suggest a batch the resume then refuses)."""
    source = checkpoint.tag_dir
    saved = saved_settings(checkpoint.meta, has_moe)
    if saved is None:
        return
    train, micro = saved.batch.train_batch_size, saved.batch.micro_batch_size
    per_step = train // micro
    if per_step % data_parallel_size:
        fits = [n for n in range(1, per_step + 1) if per_step % n == 0]
        raise ConfigError(
            f"checkpoint {source} trained {per_step} micro-batch(es) of {micro} per step (train_batch_size {train}); "
            f"a resume on another number of ranks keeps both, so the ranks must divide {per_step} micro-batches per "
            f"step, and {data_parallel_size} data-parallel rank(s) do not: resume on {' or '.join(map(str, fits))} "
            f"data-parallel rank(s), or start a new run from its weights with --init-from {source} (a new optimizer "
            f"and schedule).")


def plan_new_shape(checkpoint: CheckpointSource, parallel: ParallelPlan, ds: DeepSpeedSettings,
                   has_moe: bool) -> str | None:
    """None when the checkpoint (opened for --resume) was written on this run's shape; else the line naming old and
    new shape, after refusing, with the fix, a shape change that cannot continue the run exactly. A resharded
    checkpoint's state (`convert reshard`) is always re-laid out: its old shape is the run's it came from."""
    meta, source = checkpoint.meta, checkpoint.tag_dir
    saved = saved_settings(meta, has_moe)
    resharded = meta.run.get("resharded_from") or {}
    old = Shape(trained_world_size(meta), resharded.get("ep_size") or meta.ep_size,
                saved.zero_stage if saved else ds.zero_stage)
    new = Shape(parallel.world_size, parallel.ep_size, ds.zero_stage)
    if old == new and not meta.shape_free_state:
        return None
    own_shape = (f"resume on its own shape ({old}), or start a new run from its weights with --init-from {source} "
                 f"(a new optimizer and schedule)")
    if meta.data_order != GLOBAL_CHUNKS:
        raise CheckpointError(f"checkpoint {source} was written in the rank-strided data order of earlier widenet-ds "
                              f"versions, whose micro-batches depend on the number of ranks, so it cannot continue "
                              f"exactly on {new}: {own_shape}.")
    if saved is None:
        raise CheckpointError(f"checkpoint {source} does not record its DeepSpeed settings; {own_shape}.")
    if parallel.branch_parallel > 1:
        raise ConfigError(f"a branch-parallel run (--branch-parallel {parallel.branch_parallel}) continues on its own "
                          f"shape only: {own_shape}; or continue it on {new} without branch parallelism "
                          f"(--branch-parallel 1 --accept-changed-settings: the same model and data, each rank "
                          f"computing every branch).")
    if saved.precision != "fp32" or ds.precision != "fp32":
        precisions = (f"checkpoint {source} was trained in {saved.precision}" if saved.precision != "fp32" else
                      f"this run is {ds.precision} (checkpoint {source}: fp32)")
        raise ConfigError(f"a resume on another shape re-lays out the fp32 master weights and optimizer state of an "
                          f"fp32 run only, and {precisions}; {own_shape}.")
    if (saved.batch.train_batch_size, saved.batch.micro_batch_size) != (ds.batch.train_batch_size,
                                                                        ds.batch.micro_batch_size):
        raise ConfigError(
            f"checkpoint {source} trained with train_batch_size {saved.batch.train_batch_size} and "
            f"train_micro_batch_size_per_gpu {saved.batch.micro_batch_size}; on {new} this run has "
            f"{ds.batch.train_batch_size} and {ds.batch.micro_batch_size}. The same steps need the same global and "
            f"micro batch: set both in the DeepSpeed JSON to the checkpoint's and leave gradient_accumulation_steps "
            f"out (derived for {parallel.data_parallel_size} rank(s)); the ranks must divide "
            f"{saved.batch.train_batch_size // saved.batch.micro_batch_size} micro-batches per step.")
    return f"{old} -> {new}"
