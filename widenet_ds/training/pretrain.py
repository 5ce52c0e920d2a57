"""MLM + SOP pretraining on DeepSpeed: checks, then the loop.

`run(cfg)` first resolves and checks everything that can be wrong -- data, model config, DeepSpeed
JSON, optimizer choice, output folder, checkpoint to resume -- and only then builds the model and
the engine. The loop: accumulate micro-batches, step, log, validate, save; a SIGTERM/SIGUSR1 makes
every rank save the same step and exit cleanly.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.format import is_folder, read_folder, read_folder_config
from widenet_ds.checkpoint.load import LoadReport, load_into
from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
from widenet_ds.checkpoint.training import (CheckpointManager, TrainingState, check_resumable, check_same_model,
                                           latest_checkpoint, load_weights_only, read_meta, resolve_tag_dir,
                                           trained_ep_size)
from widenet_ds.data.loader import PretrainingDataLoader
from widenet_ds.data.shards import read_manifest
from widenet_ds.data.tokenizer import TOKENIZER_FILE, VOCAB_FILE, load_tokenizer
from widenet_ds.errors import CheckpointError, ConfigError, DataError, WideNetError
from widenet_ds.model.config import PRESETS, ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.runtime.compile import compile_for_training
from widenet_ds.runtime.distributed import check_ep_size, init_distributed, seed_everything
from widenet_ds.runtime.ds_config import (DeepSpeedSettings, load_ds_config, trajectory_changes,
                                          validate_ds_config)
from widenet_ds.runtime.engine import build_engine, expert_grad_norm_stage0, plan_optimizer
from widenet_ds.training.branch_schedule import BranchSchedule, plan_branch_schedule
from widenet_ds.training.console import mark_same_on_every_rank, say
from widenet_ds.training.log import StepMetrics, TrainingLog, memory_mib
from widenet_ds.training.preemption import SavePoints, StopRequest
from widenet_ds.training.pretrain_config import LATEST, PretrainConfig

MODEL_CONFIG_FILE = "model_config.json"


@dataclass
class RunPlan:
    """Everything checked before the first tensor is allocated."""

    model_config: ModelConfig
    ds: DeepSpeedSettings
    max_steps: int
    manifest: dict[str, Any]
    resume_from: Path | None
    init_from: Path | None  # a DeepSpeed tag folder or a portable checkpoint folder
    schedule: BranchSchedule
    resume_changes: tuple[str, ...] = ()  # accepted with --accept-changed-settings, logged at the start


# --- checks -----------------------------------------------------------------------------------------
def resolve_model_config(name_or_path: str, manifest: dict[str, Any], data_dir: Path) -> ModelConfig:
    """A preset takes the data's vocabulary size; a JSON config, or a checkpoint folder's (its
    config.json), must already match it."""
    overrides: dict[str, Any] = {}
    if name_or_path in PRESETS:
        overrides["vocab_size"] = manifest["vocab_size"]
    if Path(name_or_path).is_dir():
        cfg = _folder_model_config(Path(name_or_path), "--model-config")
    else:
        cfg = ModelConfig.load(name_or_path, **overrides)
    if cfg.vocab_size != manifest["vocab_size"]:
        raise DataError(f"model config {name_or_path} has vocab_size {cfg.vocab_size}, the data in {data_dir} was "
                        f"tokenized with {manifest['vocab_size']} tokens; use data prepared with this model's "
                        f"tokenizer or set vocab_size to {manifest['vocab_size']}.")
    if manifest["seq_length"] > cfg.max_position_embeddings:
        raise DataError(f"the data in {data_dir} has sequences of {manifest['seq_length']} tokens, more than the "
                        f"model's max_position_embeddings {cfg.max_position_embeddings}; prepare the data with "
                        f"--seq-length {cfg.max_position_embeddings} or raise max_position_embeddings.")
    return cfg


def _folder_model_config(folder: Path, flag: str) -> ModelConfig:
    if not is_folder(folder):
        raise ConfigError(f"{flag} {folder} is a directory but not a checkpoint folder (no config.json); pass a "
                          f"preset, a model-config JSON or a folder written by `widenet-ds convert to-folder`.")
    try:
        return ModelConfig.from_stored(read_folder_config(folder)["model"])[0]
    except (KeyError, TypeError, ConfigError) as err:
        raise CheckpointError(f"{folder}/config.json holds no readable model config ({err}); convert the "
                              f"checkpoint again.") from None


def resolve_max_steps(requested: int | None, schedule_steps: int | None) -> int:
    if requested is None:
        if schedule_steps is None:
            raise ConfigError("no step count: pass --max-steps, or use a scheduler with total_num_steps "
                              "(WarmupDecayLR) in the DeepSpeed config.")
        return schedule_steps
    if schedule_steps is not None and requested > schedule_steps:
        raise ConfigError(f"--max-steps {requested} runs past the schedule's total_num_steps {schedule_steps}, where "
                          f"the learning rate has decayed to its minimum; raise total_num_steps in the DeepSpeed "
                          f"config or lower --max-steps.")
    return requested


def check_same_layout(meta: dict[str, Any], ep_size: int, where: Path) -> None:
    """DeepSpeed lays out a checkpoint's expert and optimizer files per expert-parallel rank: a run resumes
    with the ep_size it was saved with (or from a resharded copy)."""
    saved = trained_ep_size(meta)
    if saved != ep_size:
        raise CheckpointError(f"checkpoint {where} was saved with --ep-size {saved}, this run has --ep-size {ep_size}; "
                              f"resume with --ep-size {saved}, or reshard the checkpoint (`widenet-ds convert reshard "
                              f"--ep-size {ep_size}`) and start from it with --init-from.")


def find_resume_point(cfg: PretrainConfig, model_config: dict[str, Any]) -> Path | None:
    """The checkpoint to continue from, after refusing an output folder that belongs to another run."""
    existing = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir.is_dir() else None
    if existing is not None:
        check_same_model(read_meta(existing), model_config, existing)
        if cfg.resume == LATEST:
            check_same_layout(read_meta(existing), cfg.ep_size, existing)
    if cfg.resume is None:
        if existing is not None:
            raise CheckpointError(f"--output-dir {cfg.output_dir} already holds checkpoints of this model (up to "
                                  f"{existing.name}); pass --resume to continue that run, or choose a new --output-dir.")
        return None
    if cfg.resume == LATEST:
        if existing is not None:
            check_resumable(existing, read_meta(existing))
        return existing  # None: nothing saved yet, so a requeued job starts from step 0
    source = resolve_tag_dir(Path(cfg.resume))
    check_resumable(source, read_meta(source))
    check_same_model(read_meta(source), model_config, source)
    check_same_layout(read_meta(source), cfg.ep_size, source)
    return source


def plan_run(cfg: PretrainConfig, world_size: int) -> RunPlan:
    """All checks that need no model: each failure is one clear error before training starts."""
    manifest = read_manifest(cfg.data_dir)
    model_config = resolve_model_config(cfg.model_config, manifest, cfg.data_dir)
    check_ep_size(cfg.ep_size, world_size, model_config.moe.num_experts if model_config.is_moe else None)
    cuda = torch.cuda.is_available()
    ds = validate_ds_config(load_ds_config(cfg.deepspeed_config), world_size=world_size,
                            has_moe=model_config.is_moe, cuda_available=cuda)
    plan_optimizer(ds, cfg.optimizer, cuda)
    batches_per_epoch = max(1, manifest["splits"]["train"]["examples"] // ds.batch.train_batch_size)
    schedule = plan_branch_schedule(cfg.branch_schedule, model_config.num_branches, batches_per_epoch, ds,
                                    cfg.prefix_cycle_batches, cfg.stage_steps)
    max_steps = schedule.end_step(resolve_max_steps(cfg.max_steps, ds.total_num_steps))
    resume_from = find_resume_point(cfg, model_config.to_dict())
    init_from = None
    if cfg.init_from is not None:
        init_from = cfg.init_from if is_folder(cfg.init_from) else resolve_tag_dir(cfg.init_from)
        saved = (_folder_model_config(init_from, "--init-from").to_dict() if is_folder(init_from)
                 else read_meta(init_from)["model_config"])
        # A new phase may change the expert placement (--ep-size), not the weights' shapes or meaning...
        check_same_model({"model_config": saved}, model_config.to_dict(), init_from)
        # ... nor what each embedding row stands for: the data's tokenizer must be the checkpoint's.
        check_checkpoint_tokenizer(load_tokenizer(cfg.data_dir), f"the tokenizer of --data {cfg.data_dir}",
                                   init_from, model_config.vocab_size, tokenizer_file=cfg.data_dir / TOKENIZER_FILE)
    if resume_from is not None and read_meta(resume_from).get("branch_schedule", "joint") != schedule.kind:
        raise CheckpointError(f"checkpoint {resume_from} was trained with --branch-schedule "
                              f"{read_meta(resume_from).get('branch_schedule', 'joint')}; resume with the same schedule.")
    if resume_from is not None:
        saved = read_meta(resume_from)["data_manifest"]
        if saved["tokenizer_sha256"] != manifest["tokenizer_sha256"]:
            raise DataError(f"checkpoint {resume_from} was trained on data of another tokenizer than {cfg.data_dir}; "
                            f"resume with the same data (a new phase on new data: use --init-from).")
    changes = tuple(trajectory_changes(read_meta(resume_from).get("deepspeed_config") or {}, ds.config)
                    if resume_from is not None else ())
    if changes and not cfg.accept_changed_settings:
        raise ConfigError(f"--resume from {resume_from} with a DeepSpeed JSON that changes the run:\n  "
                          + "\n  ".join(changes) + "\nThe resumed run would no longer be the same run. Resume with "
                          "the checkpoint's settings (its widenet_checkpoint.json holds them), or pass "
                          "--accept-changed-settings to continue with these changes (they are logged).")
    return RunPlan(model_config, ds, max_steps, manifest, resume_from, init_from, schedule, changes)


# --- the loop ---------------------------------------------------------------------------------------
def _to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in batch.items()}


@torch.no_grad()
def validate(engine, loader: PretrainingDataLoader, start_state: dict, batches: int,
             metrics: StepMetrics, branches: int | None = None, prefix: str = "valid") -> dict[str, float]:
    """MLM/SOP on the held-out split: the same `batches` micro-batches every time (the loader is rewound).
    `branches`: the first k branches only (ParaFormer's compression curve)."""
    engine.eval()
    loader.load_state_dict(start_state)
    for _, batch in zip(range(batches), loader):
        batch = _to_device(batch, engine.device)
        metrics.add(engine(**batch, branches=branches) if branches else engine(**batch), batch)
    engine.train()
    scalars, _, _ = metrics.reduce(prefix)
    return scalars


def run(cfg: PretrainConfig) -> int:
    say("starting: initialising the process group")
    init_distributed()
    rank = torch_dist.get_rank()
    world = torch_dist.get_world_size()
    say(f"{world} rank(s); checking the data, model config and DeepSpeed JSON")
    try:  # every rank reads the same inputs: these errors are the same on all of them (printed once)
        plan = plan_run(cfg, world)
        micro = plan.ds.batch.micro_batch_size
        train_loader = PretrainingDataLoader(cfg.data_dir, micro, rank, world, cfg.seed, split="train")
        valid_loader = None
        if cfg.eval_interval:
            if "valid" not in plan.manifest["splits"]:
                raise DataError(f"{cfg.data_dir} has no 'valid' split for --eval-interval; prepare the data with "
                                f"--valid-fraction > 0, or pass --eval-interval 0.")
            valid_loader = PretrainingDataLoader(cfg.data_dir, micro, rank, world, cfg.seed, split="valid")
    except WideNetError as err:
        raise mark_same_on_every_rank(err)

    # The same initial weights on every rank; then per-rank streams for gate noise and dropout.
    seed_everything(cfg.seed)
    say(f"building the model ({plan.model_config.num_layers} blocks, hidden {plan.model_config.hidden_size}, "
        f"vocabulary {plan.model_config.vocab_size})")
    model = WideNetForPreTraining(plan.model_config, ep_size=cfg.ep_size)
    model.set_activation_checkpointing(cfg.activation_checkpointing)
    init_report: LoadReport | None = None
    if plan.init_from is not None and is_folder(plan.init_from):
        # Into the module before DeepSpeed copies its parameters (ZeRO partitions, fp32 master weights).
        init_report = load_into(model, read_folder(plan.init_from), str(plan.init_from))
    compile_for_training(model, cfg.compile, cfg.compile_backend)
    say(f"initialising DeepSpeed (ZeRO stage {plan.ds.zero_stage}, {plan.ds.precision}, "
        f"{plan.ds.batch.train_batch_size} samples per step)")
    engine, optimizer_plan = build_engine(model, plan.ds, cfg.optimizer)
    seed_everything(cfg.seed + 1 + rank)

    checkpoints = CheckpointManager(cfg.checkpoint_dir, cfg.keep_last, rank, world)
    state = TrainingState()
    if plan.resume_from is not None:
        state = checkpoints.load(engine, plan.resume_from, train_loader)
    elif plan.init_from is not None and init_report is None:
        load_weights_only(engine, plan.init_from)
    if rank == 0:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        plan.model_config.to_json(cfg.output_dir / MODEL_CONFIG_FILE)
        # The run folder carries its tokenizer: finetuning and `convert to-folder` find it there.
        for name in (TOKENIZER_FILE, VOCAB_FILE):
            if (cfg.data_dir / name).is_file():
                shutil.copy2(cfg.data_dir / name, cfg.output_dir / name)
    meta = {"model_config": plan.model_config.to_dict(), "ep_size": cfg.ep_size, "deepspeed_config": plan.ds.config,
            "data_manifest": {k: plan.manifest[k] for k in ("seq_length", "vocab_size", "tokenizer_sha256")}}
    if plan.model_config.num_branches > 1:
        meta["branch_schedule"] = plan.schedule.kind

    log = TrainingLog(cfg.output_dir, enabled=rank == 0, tensorboard=cfg.tensorboard,
                      progress_bar=cfg.progress_bar, start_step=state.step, max_steps=plan.max_steps)
    log.event(state.step, f"optimizer: {optimizer_plan.reason}")
    if plan.model_config.num_branches > 1:
        log.event(state.step, f"{plan.model_config.num_branches} branches x {plan.model_config.layers_per_branch} "
                              f"blocks; {plan.schedule.describe()}; the run ends at step {plan.max_steps}")
    if plan.resume_from is not None:
        log.event(state.step, f"resumed from {plan.resume_from}")
        for change in plan.resume_changes:
            log.event(state.step, f"changed since the checkpoint (--accept-changed-settings): {change}")
    elif plan.init_from is not None:
        log.event(state.step, f"weights from {plan.init_from} (new optimizer and schedule)")
        for line in init_report.summary().splitlines() if init_report is not None else ():
            log.event(state.step, line)
    stop = StopRequest()
    stop.install()
    say(f"training: steps {state.step + 1} to {plan.max_steps}")
    try:
        valid_start = valid_loader.state_dict() if valid_loader is not None else None
        finished = _train(cfg, plan, engine, train_loader, valid_loader, valid_start, checkpoints, state, log, stop,
                          meta)
        if finished and valid_loader is not None and plan.model_config.num_branches > 1:
            # ParaFormer's compression curve: held-out MLM/SOP of the first k branches, no retraining.
            for k in range(1, plan.model_config.num_branches + 1):
                metrics = StepMetrics(plan.model_config.routing_blocks,
                                      plan.model_config.moe.num_experts if plan.model_config.is_moe else 0)
                log.record(state.step, validate(engine, valid_loader, valid_start, cfg.eval_batches, metrics,
                                                branches=k, prefix=f"valid_branches_{k}"))
    finally:
        stop.uninstall()
        log.close()
    return 0


def _train(cfg, plan: RunPlan, engine, train_loader, valid_loader, valid_start: dict | None,
           checkpoints: CheckpointManager, state: TrainingState, log: TrainingLog, stop: StopRequest,
           meta: dict[str, Any]) -> bool:
    """The loop over batches; True when max_steps was reached, False when stopped by a signal."""
    mcfg = plan.model_config
    num_experts = mcfg.moe.num_experts if mcfg.is_moe else 0
    train_metrics = StepMetrics(mcfg.routing_blocks, num_experts)
    valid_metrics = StepMetrics(mcfg.routing_blocks, num_experts)
    own_grad_norm = plan.ds.zero_stage == 0 and plan.ds.precision == "fp32"
    accumulation = plan.ds.batch.gradient_accumulation_steps
    branched = mcfg.num_branches > 1
    batches = iter(train_loader)
    batch_index = plan.schedule.batch_at_step(state.step)
    trainable = mcfg.num_branches
    window_seconds = 0.0  # training time of the logging window (validation and saving excluded)
    save_points = SavePoints(checkpoints, stop, log, cfg.save_interval, plan.max_steps,
                             saved_step=state.step if plan.resume_from is not None else None)
    engine.train()
    while state.step < plan.max_steps:
        first_step = state.step
        micro_batches: list[dict[str, torch.Tensor]] = []  # drawn once, reused by each prefix of a batch
        for active in plan.schedule.branch_counts(batch_index, state.step):
            if branched and active != trainable:
                engine.module.encoder.set_trainable_branches(active)
                trainable = active
            lr = engine.get_lr()[0]  # the rate this step uses (read before the scheduler advances)
            log_now = (state.step + 1) % cfg.log_interval == 0 or state.step + 1 == plan.max_steps
            grad_norm = None
            step_start = time.perf_counter()
            for micro_step in range(accumulation):
                if micro_step == len(micro_batches):
                    micro_batches.append(_to_device(next(batches), engine.device))
                batch = micro_batches[micro_step]
                output = engine(**batch, branches=active) if branched else engine(**batch)
                engine.backward(output.loss)
                if log_now and own_grad_norm and micro_step == accumulation - 1:
                    grad_norm = expert_grad_norm_stage0(engine.module, cfg.ep_size)
                engine.step()
                train_metrics.add(output, batch)
            state.step += 1
            state.samples += plan.ds.batch.train_batch_size
            log.advance()
            window_seconds += time.perf_counter() - step_start

            if log_now:
                scalars, samples, tokens = train_metrics.reduce("train")
                if grad_norm is None:
                    grad_norm = float(engine.get_global_grad_norm())
                scalars.update({
                    "optim/lr": lr, "optim/grad_norm": grad_norm,
                    # fp32 / bf16 optimizers do no loss scaling and have no loss_scale attribute.
                    "optim/loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0)),
                    "perf/samples_per_second": samples / window_seconds,
                    "perf/tokens_per_second": tokens / window_seconds,
                    "perf/memory_mib": memory_mib(),
                })
                if branched:
                    scalars["branches/active"] = active
                log.record(state.step, scalars)
                window_seconds = 0.0
            if valid_loader is not None and state.step % cfg.eval_interval == 0:
                log.record(state.step, validate(engine, valid_loader, valid_start, cfg.eval_batches, valid_metrics))
        batch_index += 1
        if save_points.after_batch(first_step, engine, state, train_loader, meta):
            return False
    return True
