"""The one training loop. `Trainer(cfg, task, plan, stop).run()`: build -> resume -> steps -> save or stop -> the
task's final evaluation and results. A task (training/task.py: pretraining, a finetuning seed, image
classification) supplies the data, the model, the forward, what is measured and how it is evaluated; the
loop is the same for all of them (torchtitan's `Trainer` shape).

The step skeleton: each batch takes one optimizer step, or with ParaFormer's prefix schedule one per nested
prefix of branches (the micro-batches drawn once and reused); metrics are summed on the device and reduced
when a record is due (every `log_interval` steps, at the last step and at every interval checkpoint, so a
run resumed from a checkpoint logs the same windows); evaluations every `eval_interval` steps and at the
end of a finished run; checkpoints between batches (`SavePoints`). `run()` returns True when the run
reached its last step, False when a signal stopped it (saved; `--resume` continues).

Seeding, one rule: the initial weights from `init_seed` (the same on every rank), then each data-parallel
rank's stream (dropout, routing noise, augmentation) from `stream_seed + 1 + rank`; the ranks of a branch
group share one stream, as they compute on the same examples.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.manager import (
    CheckpointManager,
    TrainingState,
    load_weights_only,
)
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.relayout import resume_on_new_shape
from widenet_ds.distributed.collective_timeouts import apply_current_timeout
from widenet_ds.distributed.console import say
from widenet_ds.engine.build import build_engine, expert_grad_norm_stage0
from widenet_ds.engine.compile import compile_for_training
from widenet_ds.run_folder import RunFolder
from widenet_ds.seeds import SEED_SPACING
from widenet_ds.training.log import TrainingLog, memory_mib
from widenet_ds.training.plan import RunPlan
from widenet_ds.training.preemption import SavePoints, StopRequest
from widenet_ds.training.run_config import RunConfig
from widenet_ds.training.task import Task


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch generators (NumPy takes 32-bit seeds)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_record(cfg: RunConfig, plan: RunPlan) -> dict[str, Any]:
    """run_config.json: the run's settings and the DeepSpeed settings it trains with (a --resume must find them)."""
    return {**cfg.record(), "deepspeed_settings": plan.ds.config}


class Trainer:
    """Trains `task` by `plan` (`plan_task` made it and gave it to the task) in the task's folder, which it owns: it
    writes the folder's model_config.json, run_config.json (unless `records_settings` is False: a finetuning
    seed's settings are the sweep's, in the run folder) and results.json."""

    def __init__(self, cfg: RunConfig, task: Task, plan: RunPlan, stop: StopRequest, *, records_settings: bool = True,
                 console_label: str | None = None) -> None:
        self.cfg, self.task, self.plan, self.stop = cfg, task, plan, stop
        self.folder: RunFolder = task.folder
        self.records_settings, self.console_label = records_settings, console_label

    def run(self) -> tuple[bool, Any]:
        """(finished, the task's final result); finished False: stopped by a signal, saved."""
        cfg, plan, task = self.cfg, self.plan, self.task
        parallel = plan.parallel
        rank = torch_dist.get_rank()
        loader = task.train_loader()

        seed_everything(task.init_seed)  # the same initial weights on every rank
        model, weight_lines = task.build_model()
        model.set_activation_checkpointing(cfg.activation_checkpointing)
        parallel.apply(model)
        compile_for_training(model, cfg.compile, cfg.compile_backend)
        say(f"initialising DeepSpeed (ZeRO stage {plan.ds.zero_stage}, {plan.ds.precision}, "
            f"{plan.ds.batch.train_batch_size} samples per step)")
        engine, _ = build_engine(model, plan.ds, cfg.optimizer, parallel.deepspeed_config(plan.ds.config))
        apply_current_timeout()  # DeepSpeed's expert and data-parallel groups: the run's bound, not torch's 30 minutes
        seed_everything(task.stream_seed + 1 + parallel.data_parallel_rank)

        checkpoints = CheckpointManager(self.folder.checkpoints, cfg.keep_last, rank, parallel.world_size)
        state = TrainingState()
        if plan.new_shape is not None:
            say(f"resuming {plan.resume.tag_dir} {plan.new_shape.words()}")
            state = resume_on_new_shape(engine, plan.resume, loader, parallel.ep_size, rank)
            # The old ranks' streams (dropout, routing noise, augmentation) have no counterpart here: new ones,
            # keyed by the step (not the start's streams again); checkpoints from here on save them as usual.
            seed_everything(task.stream_seed + 1 + parallel.data_parallel_rank + SEED_SPACING * state.step)
        elif plan.resume is not None:
            state = checkpoints.load(engine, plan.resume, loader)
        elif task.init_source is not None and not weight_lines:
            load_weights_only(engine, task.init_source.tag_dir)  # a DeepSpeed checkpoint: into the engine
            weight_lines = [f"weights from {cfg.init_from} (new optimizer and schedule)"]

        if state.step >= plan.max_steps and self.folder.results.is_file():
            say(f"the run in {self.folder.path} is complete (step {state.step}); its results: {self.folder.results}")
            return True, self.folder.read_results(task.RESULTS)
        # Before the first step: room for a checkpoint (its size known from the resumed one, else estimated).
        checkpoints.expect(engine, parallel.ep_size, plan.resume.meta if plan.resume else None)
        checkpoints.check_space("a checkpoint of this run", "Free space there, or choose an --output-dir on a disk "
                                                            "with more space.")
        log = TrainingLog(self.folder, enabled=rank == 0, tensorboard=cfg.tensorboard, progress_bar=cfg.progress_bar,
                          start_step=state.step, max_steps=plan.max_steps, console_label=self.console_label)
        try:
            log.event(state.step, f"optimizer: {plan.optimizer.reason}")
            cfg_model = plan.model_config
            if cfg_model.num_branches > 1:
                log.event(state.step, f"{cfg_model.num_branches} branches x {cfg_model.layers_per_branch} blocks; "
                                      f"{plan.schedule.describe()}; the run ends at step {plan.max_steps}")
            if parallel.branch_parallel > 1:
                log.event(state.step, f"branch-parallel: groups of {parallel.branch_parallel} ranks, this rank's branches "
                                      f"{list(engine.module.encoder.branch_parallel.branches)}")
            if plan.resume is not None:
                log.event(state.step, f"resumed from {plan.resume.tag_dir}"
                          + (f" {plan.new_shape.words()}: weights, optimizer state, schedule and data position "
                             f"carried over; new random streams; {plan.new_shape.continuation()}"
                             if plan.new_shape else ""))
                for change in plan.changes:
                    log.event(state.step, f"changed since the checkpoint (--accept-changed-settings): {change}")
            else:
                for line in weight_lines:
                    log.event(state.step, line)
            for note in plan.notes:
                log.event(state.step, note)
            if rank == 0:  # from here on the folder holds this run: a new run there is refused, --resume continues
                plan.model_config.to_json(self.folder.model_config)
                if self.records_settings:
                    self.folder.write_run_config(run_record(cfg, plan))
            task.start(engine, log, state)
            say(f"training: steps {state.step + 1} to {plan.max_steps}" if state.step < plan.max_steps
                else f"training: the run already reached step {plan.max_steps}")
            meta = CheckpointMeta(step=state.step, samples=state.samples, world_size=parallel.world_size,
                                  ep_size=parallel.ep_size, model_config=cfg_model.to_dict(), deepspeed_config=plan.ds.config,
                                  architecture=type(model).__name__, task=cfg.TASK,
                                  branch_schedule=plan.schedule.kind, data_order=plan.data_order,
                                  branch_parallel=parallel.branch_parallel,
                                  loss_normalisation=plan.loss_normalisation, run=task.meta())
            finished = self._steps(engine, loader, checkpoints, state, log, meta)
            if not finished:
                return False, None
            if cfg_model.num_branches > 1:
                engine.module.encoder.set_trainable_branches(cfg_model.num_branches)
            results = task.finish(engine, state, log)
            if rank == 0:
                self.folder.write_results(results)
            return True, results
        finally:
            log.close()

    def _steps(self, engine, loader, checkpoints: CheckpointManager, state: TrainingState, log: TrainingLog,
               meta: CheckpointMeta) -> bool:
        """The loop over batches; True when max_steps was reached, False when stopped by a signal."""
        cfg, plan, task = self.cfg, self.plan, self.task
        train_metrics = task.metrics()
        own_grad_norm = plan.ds.zero_stage == 0 and plan.ds.precision == "fp32"  # DeepSpeed computes none then
        accumulation = plan.ds.batch.gradient_accumulation_steps
        branched = plan.model_config.num_branches > 1
        encoder = engine.module.encoder
        batches = iter(loader)
        batch_index = plan.schedule.batch_at_step(state.step)
        trainable = plan.model_config.num_branches
        window_seconds = 0.0  # training time of the logging window (evaluation and saving excluded)
        save_points = SavePoints(checkpoints, self.stop, log, cfg.save_interval, plan.max_steps,
                                 saved_step=state.step if plan.resume is not None else None)
        engine.train()
        while state.step < plan.max_steps:
            first_step = state.step
            counts = plan.schedule.branch_counts(batch_index, state.step)
            # A checkpoint closes the logging window, so that a run resumed from it logs the same windows.
            closes_window = save_points.crosses(first_step, first_step + len(counts))
            micro_batches: list[dict[str, torch.Tensor]] = []  # drawn once, reused by each prefix of a batch
            weights = None  # of each micro-batch's per-token losses (Task.loss_weights)
            if task.WEIGHS_STEP:
                micro_batches = [task.micro_batch(batches, engine) for _ in range(accumulation)]
                weights = task.loss_weights(micro_batches)
            for index, active in enumerate(counts):
                if branched and active != trainable:
                    encoder.set_trainable_branches(active)
                    trainable = active
                lr = engine.get_lr()[0]  # the rate this step uses (read before the scheduler advances)
                log_now = ((state.step + 1) % cfg.log_interval == 0 or state.step + 1 == plan.max_steps
                           or (closes_window and index == len(counts) - 1))
                grad_norm = None
                step_start = time.perf_counter()
                for micro_step in range(accumulation):
                    if micro_step == len(micro_batches):
                        micro_batches.append(task.micro_batch(batches, engine))
                    batch = micro_batches[micro_step]
                    output = task.forward(engine, batch, active if branched else None,
                                          None if weights is None else weights[micro_step])
                    engine.backward(output.loss)
                    if log_now and own_grad_norm and micro_step == accumulation - 1:
                        grad_norm = expert_grad_norm_stage0(engine.module, plan.parallel.ep_size)
                    engine.step()
                    train_metrics.add(output, batch)
                state.step += 1
                state.samples += plan.ds.batch.train_batch_size
                log.advance()
                window_seconds += time.perf_counter() - step_start
                if log_now:
                    scalars, counted = train_metrics.reduce("train")
                    if grad_norm is None:
                        grad_norm = float(engine.get_global_grad_norm() or 0.0)
                    scalars.update({
                        "optim/lr": lr, "optim/grad_norm": grad_norm,
                        # fp32 / bf16 optimizers do no loss scaling and have no loss_scale attribute.
                        "optim/loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0)),
                        **{f"perf/{name}_per_second": count / window_seconds for name, count in counted.items()},
                        "perf/memory_mib": memory_mib(), **task.train_scalars()})
                    if branched:
                        scalars["branches/active"] = active
                    log.record(state.step, scalars)
                    log.console(state.step, task.train_line(scalars))
                    window_seconds = 0.0
                if cfg.eval_interval and state.step % cfg.eval_interval == 0 and state.step != plan.max_steps:
                    task.evaluate(engine, state.step, log)
            batch_index += 1
            if save_points.after_batch(first_step, engine, state, loader, meta):
                return False
        return True


