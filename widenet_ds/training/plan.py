"""Everything a run checks before its first tensor: the model, the parallel layout, the DeepSpeed JSON, the
optimizer, the branch schedule, the step count and the checkpoint to continue from. Each problem is one
clear error here, the same on every rank, before any rank builds anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import RESUME, CheckpointSource
from widenet_ds.checkpoint.tags import latest_checkpoint
from widenet_ds.data.batch_order import GLOBAL_CHUNKS, LOSS_PER_MICRO_BATCH
from widenet_ds.distributed.console import say
from widenet_ds.distributed.parallel import ParallelPlan
from widenet_ds.engine.build import OptimizerPlan, plan_optimizer
from widenet_ds.engine.ds_config import (
    DeepSpeedSettings,
    load_ds_config,
    trajectory_changes,
    validate_ds_config,
)
from widenet_ds.errors import (
    CheckpointError,
    ConfigError,
    WideNetError,
    mark_same_on_every_rank,
)
from widenet_ds.portable.format import check_same_model
from widenet_ds.run_folder import RunFolder
from widenet_ds.training.branch_schedule import BranchSchedule, plan_branch_schedule
from widenet_ds.training.new_shape import (
    NewShape,
    check_micro_batches_divide,
    plan_new_shape,
    random_draws,
    routing_fixes,
    routing_per_rank,
    routing_words,
)
from widenet_ds.training.run_config import LATEST, RunConfig, setting_changes


@dataclass(frozen=True)
class RunPlan:
    model_config: Any  # ModelConfig or VisionConfig
    parallel: ParallelPlan
    ds: DeepSpeedSettings
    optimizer: OptimizerPlan
    schedule: BranchSchedule
    max_steps: int
    notes: tuple[str, ...] = ()    # what the run does that a user may not expect (logged as events)
    resume: CheckpointSource | None = None  # the checkpoint to continue from, opened for --resume
    changes: tuple[str, ...] = ()  # settings changed since the checkpoint, accepted with --accept-changed-settings
    new_shape: NewShape | None = None  # when the checkpoint is re-laid out for this run's shape
    data_order: str = GLOBAL_CHUNKS  # the order the loaders use: the resumed checkpoint's (data/batch_order.py)
    loss_normalisation: str = LOSS_PER_MICRO_BATCH  # how a step weighs its per-token losses (data/batch_order.py):
    #   a new run each micro-batch's own mean (its curve as before, the golden curves'); the step's counts from a
    #   resume onto another micro batch on


def resolve_max_steps(requested: int | None, ds: DeepSpeedSettings, also: str = "") -> int:
    """The run's length: what was asked for, else the DeepSpeed schedule's; never past the schedule's end.
    `also`: what a run must be given besides to take a changed schedule (RunConfig.schedule_change_flags)."""
    schedule_steps = ds.total_num_steps
    if requested is None:
        if schedule_steps is None:
            raise ConfigError("no step count: pass --max-steps, or use a scheduler with total_num_steps "
                              "(WarmupDecayLR) in the DeepSpeed config.")
        return schedule_steps
    if schedule_steps is not None and requested > schedule_steps:
        raise ConfigError(f"--max-steps {requested} runs past the schedule's total_num_steps {schedule_steps}, where "
                          f"the learning rate has decayed to its minimum; set {ds.schedule_change(requested)} in the "
                          f"DeepSpeed config{also}, or lower --max-steps to {schedule_steps}.")
    return requested


def schedule_notes(max_steps: int, ds: DeepSpeedSettings, also: str = "") -> tuple[str, ...]:
    """A run shorter than its learning-rate schedule ends before the rate has decayed: said, not refused
    (short runs are how a set-up is tried)."""
    schedule_steps = ds.total_num_steps
    if schedule_steps is None or not 0 < max_steps < schedule_steps:  # (0: --eval-only trains no step)
        return ()
    return (f"the run ends at step {max_steps}, before the DeepSpeed schedule's total_num_steps {schedule_steps}: "
            f"the learning rate will not have decayed to its end value. For a complete schedule set "
            f"{ds.schedule_change(max_steps)} in the DeepSpeed config{also}.",)


def branch_parallel_notes(parallel: ParallelPlan, model_config) -> tuple[str, ...]:
    """A branch group's ranks each draw dropout masks and routing noise for their own branches, and route their own
    branches' tokens (the balance loss, the expert capacity), one rank the whole model's: the same model and data,
    other draws and routing sums. Said, not refused."""
    if parallel.branch_parallel == 1:
        return ()
    draws, routing = random_draws(model_config), routing_per_rank(model_config)
    if not draws and not routing:
        return ()
    said = []
    if draws:
        said.append(", ".join(f"{name} {value}" for name, value in draws.items()) + " draw on each rank for its own "
                    "branches")
    if routing:
        said.append(f"{routing_words(routing)} are each rank's own branches'")
    fixes = [f"--set {name}=none" if name == "moe.noise" else f"--set {name}=0" for name in draws]
    return (f"branch-parallel: {'; '.join(said)}, so this run trains otherwise than the same run on one rank (step for "
            f"step the same only without them: {' '.join(fixes + routing_fixes(routing))}).",)


def plan_layout(cfg: RunConfig, model_config, world_size: int, rank: int, cuda: bool | None = None
                ) -> tuple[ParallelPlan, DeepSpeedSettings, OptimizerPlan]:
    """The parallel layout, the DeepSpeed JSON checked against it, and the optimizer that will run (`cuda`: whether
    the ranks have a GPU; None: this machine's answer)."""
    parallel = ParallelPlan.plan(world_size, rank, cfg.ep_size, cfg.branch_parallel, model_config)
    cuda = torch.cuda.is_available() if cuda is None else cuda
    ds = validate_ds_config(load_ds_config(cfg.deepspeed_config), world_size=parallel.data_parallel_size,
                            has_moe=model_config.is_moe, cuda_available=cuda)
    parallel.check_deepspeed(ds)
    return parallel, ds, plan_optimizer(ds, cfg.optimizer, cuda)


def find_resume(cfg: RunConfig, folder: RunFolder) -> CheckpointSource | None:
    """The checkpoint `--resume` continues in `folder` (None: a fresh start), opened: its files checked and its
    state complete, on every rank before any rank loads a file of it."""
    existing = latest_checkpoint(folder.checkpoints) if folder.checkpoints.is_dir() else None
    if cfg.resume is None:
        if existing is not None:  # (the settings refuse a used folder; this catches a checkpoints/ alone)
            raise CheckpointError(f"{folder.path} already holds checkpoints (up to {existing.name}); pass --resume to "
                                  f"continue that run, or choose a new --output-dir.")
        return None
    if cfg.resume == LATEST and existing is None:
        return None  # nothing saved yet: a requeued job starts from step 0
    return CheckpointSource.open(existing if cfg.resume == LATEST else cfg.resume, "--resume", purpose=RESUME)


def keep_saved_dispatch(saved: dict[str, Any], model_config, overrides: list[str]):
    """`model_config` with the dispatch the checkpoint was trained with, unless `--set moe.dispatch=...` asks for
    another: the dispatch says how the same weights are computed, not what they are, and a run saved before
    "compact" became the default continues with its own arithmetic when its preset is named again."""
    saved_dispatch = (saved.get("moe") or {}).get("dispatch")
    if (saved_dispatch is None or saved_dispatch == model_config.moe.dispatch
            or any(o.startswith("moe.dispatch=") for o in overrides)):
        return model_config
    return replace(model_config, moe=replace(model_config.moe, dispatch=saved_dispatch))


def resume_changes(cfg: RunConfig, folder: RunFolder, ds: DeepSpeedSettings, meta: CheckpointMeta | None) -> list[str]:
    """What differs from the run being continued: its settings (run_config.json) and what its DeepSpeed JSON
    does to the trajectory (batch, optimizer, schedule, clipping, precision). A saved relative path that cannot be
    placed from this folder (an older run's, copied or moved) is said, and not compared: it is no change."""
    saved, unplaced = (type(cfg).saved_record(folder.read_run_config(), folder.path) if folder.run_config.is_file()
                       else (None, []))
    if unplaced:
        say(f"--resume: the saved {', '.join(unplaced)} of {folder.path} are relative paths that cannot be placed "
            f"from where the folder is now (it was copied or moved); they are not compared with this run's")
    current = cfg.record()
    for name in (line.split(" ")[0] for line in unplaced):
        saved.pop(name, None)
        current.pop(name, None)
    changes = setting_changes(saved, current) if saved is not None else []
    saved_ds = saved.get("deepspeed_settings") if saved is not None else (meta.deepspeed_config if meta else None)
    if saved_ds:
        changes += trajectory_changes(saved_ds, ds.config)
    return changes


def check_resume_changes(cfg: RunConfig, where: Path, changes: list[str]) -> None:
    if changes and not cfg.accept_changed_settings:
        raise ConfigError(f"--resume of the run in {where} with settings that change it:\n  " + "\n  ".join(changes)
                          + "\nThe resumed run would no longer be the same run. Resume with the run's settings (its "
                            "run_config.json holds them), or pass --accept-changed-settings to continue with these "
                            "changes (they are logged).")


def plan_task(cfg: RunConfig, task, world_size: int, rank: int) -> RunPlan:
    """Every check of a run of `task` into its folder (`check_plan`), then the task's loaders."""
    plan = check_plan(cfg, task, world_size, rank)
    try:
        task.prepare(plan)
    except WideNetError as err:
        raise mark_same_on_every_rank(err)
    return plan


def check_plan(cfg: RunConfig, task, world_size: int, rank: int, cuda: bool | None = None,
               data_here: bool = True) -> RunPlan:
    """Every check of a run of `task` into its folder on `world_size` ranks, as rank `rank` makes them: errors of
    every rank alike (they read the same inputs), printed once. A resumed run's settings are compared with its
    run_config.json here (a finetuning sweep compares them once for all its seeds: `check_resume_changes`). The start
    of a run (`plan_task`) and a dry run on another machine (launch/dry_run.py: `cuda`, whether the job's ranks have
    a GPU; `data_here` False: the task's data is not on this machine, and the model is sized from the settings) make
    the same checks."""
    try:
        resume = find_resume(cfg, task.folder)
        plan = plan_run(cfg, task, world_size, rank, resume, cuda, data_here)
        plan = plan_resume(cfg, task, plan, resume, data_here)
        if plan.resume is not None:
            # (a setting the new shape needs, a micro batch the ranks can form, is no change to accept)
            needed = plan.new_shape.accepted_changes if plan.new_shape else ()
            changes = [c for c in resume_changes(cfg, cfg.folder, plan.ds, plan.resume.meta)
                       if c.partition(":")[0] not in needed]
            plan = replace(plan, changes=tuple(changes))
            check_resume_changes(cfg, cfg.output_dir, changes)
    except WideNetError as err:
        raise mark_same_on_every_rank(err)
    return plan


def plan_run(cfg: RunConfig, task, world_size: int, rank: int, resume: CheckpointSource | None = None,
             cuda: bool | None = None, data_here: bool = True) -> RunPlan:
    """The checks every task shares, made once per run (a finetuning sweep's seeds share them): the task's model
    (its data read and checked), the layout, the DeepSpeed settings, the data, the branch schedule and the
    length. The hooks are called in the order training/task.py lists. `resume`: the checkpoint the run
    continues, when it is known (`find_resume`): its needs are named before the DeepSpeed JSON's. `data_here`
    False (a dry run): the model as the settings give it, and no data read."""
    model_config = task.model_config() if data_here else task.model_config_from_settings()
    # The layout's own refusals (an ep size or branch group the ranks or experts cannot form) come before a resume's
    # micro-batch one: theirs is the fix to make first.
    ParallelPlan.plan(world_size, rank, cfg.ep_size, cfg.branch_parallel, model_config)
    try:
        parallel, ds, optimizer = plan_layout(cfg, model_config, world_size, rank, cuda)
    except ConfigError:  # a resume on other ranks: what the checkpoint needs comes first (its fix, not the JSON's)
        if resume is not None:
            check_micro_batches_divide(resume, world_size // cfg.branch_parallel, model_config.is_moe)
        raise
    task.check_settings(ds)
    if data_here:
        task.load_data()
    epoch = task.batches_per_epoch(ds.batch.train_batch_size) if data_here else None
    if epoch is None and cfg.branch_schedule == "prefix" and cfg.prefix_cycle_batches is None:
        raise ConfigError("--branch-schedule prefix cycles once per epoch of the data, which is not on this machine: "
                          "pass --prefix-cycle-batches N to plan the run here.")
    schedule = plan_branch_schedule(cfg.branch_schedule, model_config.num_branches, epoch, ds,
                                    cfg.prefix_cycle_batches, cfg.stage_steps)
    also = cfg.schedule_change_flags(resuming=resume is not None)
    max_steps = schedule.end_step(resolve_max_steps(task.requested_steps(ds), ds, also))
    notes = schedule_notes(max_steps, ds, also) + branch_parallel_notes(parallel, model_config)
    return RunPlan(model_config, parallel, ds, optimizer, schedule, max_steps, notes=notes)


def plan_resume(cfg: RunConfig, task, plan: RunPlan, source: CheckpointSource | None,
                data_here: bool = True) -> RunPlan:
    """`plan` for continuing from `source` (`find_resume` of the run's folder, or of a finetuning seed's folder for
    each seed): checked to continue this run exactly, with the model in the checkpoint's dispatch (`data_here`
    False: the checkpoint's data is not compared with the task's, which is not on this machine)."""
    if source is None:
        return plan
    meta = source.meta
    model_config = keep_saved_dispatch(meta.model_config, plan.model_config, cfg.overrides)
    check_same_model(meta.model_config, model_config.to_dict(), source.tag_dir, meta.architecture)
    if meta.branch_schedule != plan.schedule.kind:
        raise CheckpointError(f"checkpoint {source.tag_dir} was trained with --branch-schedule {meta.branch_schedule}; "
                              f"resume with the same schedule.")
    if data_here:
        task.check_resume(meta, source)
    new_shape = plan_new_shape(source, plan.parallel, plan.ds, model_config)
    return replace(plan, model_config=model_config, resume=source, new_shape=new_shape, data_order=meta.data_order,
                   loss_normalisation=new_shape.loss_normalisation if new_shape else meta.loss_normalisation)
