"""One finetuning loop on DeepSpeed for every task; a task is data + head + metric (`GlueTaskRun`,
`SquadTaskRun` in `finetune_tasks.py`). The entrypoints `finetune/run_glue.py` and `finetune/run_squad.py`
only parse flags.

Batch size, learning rate and schedule live only in the DeepSpeed JSON (ds_configs/finetune_*.json carry
the paper's Table 7 recipes); the task recipe (`tasks/recipes.py`) gives the capacity factor, balance
weight, dropout and max length, each overridable by a flag, and the run refuses a JSON whose batch size,
learning rate or schedule differ from the recipe unless `--allow-recipe-mismatch` is given.

As in pretraining: every check runs before a model is built (`plan_finetune`); each seed checkpoints every
`--save-interval` steps (`CheckpointManager`: complete or absent, keep-last-K); SIGTERM/SIGUSR1 make every
rank save the same step and exit 0; `--resume` continues exactly (weights, optimizer, schedule, data
position, RNG states) at the seed and step the run stopped at, keeping the finished seeds' results.

Output folder:

    run_config.json      the settings (a --resume must find them unchanged)
    metrics.jsonl        the run's events (data read, load report, recipe, seeds done, results)
    results.json         per-seed metrics and their median, written when every seed is done
    seed<N>/             metrics.jsonl + tensorboard/ of the seed, prediction files, result.json once the
                         seed is done, checkpoints/ while it runs (removed when it is done), model/ (--save-model)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.atomic import atomic_write_json
from widenet_ds.checkpoint.training import (
    CheckpointManager,
    TrainingState,
    check_same_model,
    latest_checkpoint,
    read_meta,
)
from widenet_ds.errors import ConfigError, DataError, WideNetError, raise_config_problems
from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
from widenet_ds.runtime.distributed import init_distributed, seed_everything
from widenet_ds.runtime.ds_config import DeepSpeedSettings, load_ds_config, validate_ds_config
from widenet_ds.runtime.engine import build_engine
from widenet_ds.tasks.features import check_max_length, check_tokenizer_matches
from widenet_ds.tasks.recipes import FinetuneRecipe
from widenet_ds.training.finetune_config import RESULTS_FILE, RUN_CONFIG_FILE, FinetuneConfig, changed_settings
from widenet_ds.training.finetune_tasks import TaskRun
from widenet_ds.training.console import report_error
from widenet_ds.training.finetune_weights import load_tokenizer_for, model_overrides, save_finetuned
from widenet_ds.training.log import TrainingLog, read_metrics
from widenet_ds.training.predict import Batching, Prepared
from widenet_ds.training.preemption import SavePoints, StopRequest

SEED_RESULT_FILE = "result.json"


# --- data order -------------------------------------------------------------------------------------
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


# --- checks before any model is built -----------------------------------------------------------------
def _peak_lr(settings: DeepSpeedSettings) -> float | None:
    scheduler = settings.config.get("scheduler") or {}
    params = scheduler.get("params", {})
    return params.get("warmup_max_lr", settings.config.get("optimizer", {}).get("params", {}).get("lr"))


def _warmup_steps(settings: DeepSpeedSettings) -> int | None:
    return ((settings.config.get("scheduler") or {}).get("params") or {}).get("warmup_num_steps")


def resolve_max_steps(cfg: FinetuneConfig, schedule_steps: int | None, recipe: FinetuneRecipe) -> int:
    """--max-steps, else the schedule's length, else the recipe's; never past the schedule's end."""
    steps = cfg.max_steps or schedule_steps or recipe.steps
    if schedule_steps is not None and steps > schedule_steps:
        raise ConfigError(f"--max-steps {steps} runs past the schedule's total_num_steps {schedule_steps} in "
                          f"{cfg.deepspeed_config}; raise total_num_steps there or lower --max-steps.")
    return steps


def recipe_mismatch(recipe: FinetuneRecipe, settings: DeepSpeedSettings) -> list[str]:
    """How the DeepSpeed JSON's batch size, learning rate and schedule differ from the task recipe."""
    return recipe.differences(batch_size=settings.batch.train_batch_size, learning_rate=_peak_lr(settings),
                              warmup_steps=_warmup_steps(settings), steps=settings.total_num_steps)


@dataclass
class FinetunePlan:
    """Everything checked before the first tensor is allocated."""

    ds_config: dict[str, Any]
    settings: DeepSpeedSettings
    recipe: FinetuneRecipe
    max_steps: int
    mismatch: list[str]  # recipe vs DeepSpeed JSON, accepted with --allow-recipe-mismatch
    record: dict[str, Any]  # run_config.json
    complete: dict[str, Any] | None  # results.json of a finished run being resumed


def _json_values(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def plan_finetune(cfg: FinetuneConfig, task_run: TaskRun, world: int) -> FinetunePlan:
    """All checks that need no model; every problem found is reported in one ConfigError."""
    problems = []  # (--ep-size is checked against the world size and the experts in build_model)
    ds_config = load_ds_config(cfg.deepspeed_config)
    settings = validate_ds_config(ds_config, world_size=world, has_moe=False, cuda_available=torch.cuda.is_available())
    recipe = task_run.recipe()
    max_steps = 0
    if not cfg.eval_only:
        try:
            max_steps = resolve_max_steps(cfg, settings.total_num_steps, recipe)
        except ConfigError as err:
            problems.append(str(err))
    mismatch = [] if cfg.eval_only else recipe_mismatch(recipe, settings)
    if mismatch and not cfg.allow_recipe_mismatch:
        problems.append(f"{cfg.deepspeed_config} disagrees with the {task_run.name} recipe ({recipe.source}): "
                        f"{'; '.join(mismatch)}. Use a DeepSpeed JSON with the recipe's values (the paper's: "
                        f"ds_configs/finetune_{{sst2,mnli,squad11,squad20}}.json), or pass --allow-recipe-mismatch "
                        f"to train with the JSON's.")
    record = _json_values({**cfg.as_record(), "deepspeed_settings": ds_config})
    saved_path = cfg.output_dir / RUN_CONFIG_FILE
    complete = None
    if cfg.resume and saved_path.is_file():
        changes = changed_settings(json.loads(saved_path.read_text()), record)
        if changes:
            problems.append(f"--resume: the run in {cfg.output_dir} was started with other settings:\n    "
                            + "\n    ".join(changes)
                            + "\n  resume with the same settings, or start a new run in another --output-dir.")
        elif (cfg.output_dir / RESULTS_FILE).is_file():
            complete = json.loads((cfg.output_dir / RESULTS_FILE).read_text())
            if complete.get("seeds") != cfg.seeds:
                complete = None  # more (or fewer) seeds asked for: the summary is made again
    raise_config_problems(problems, "the finetuning run")
    return FinetunePlan(ds_config, settings, recipe, max_steps, mismatch, record, complete)


# --- the loop -----------------------------------------------------------------------------------------
def _training_seed(seed: int, rank: int) -> int:
    """Each rank's stream for dropout and gate noise, apart from every seed's initialisation stream."""
    return 1_000_003 * seed + 1 + rank


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    torch_dist.all_reduce(tensor)
    return tensor.tolist()


@dataclass
class SeedLoop:
    """What one seed's training needs besides the engine."""

    batches: EpochBatches
    batching: Batching
    accumulation: int
    max_steps: int
    checkpoints: CheckpointManager
    meta: dict[str, Any]
    log: TrainingLog
    stop: StopRequest


def train(cfg: FinetuneConfig, engine, loop: SeedLoop, state: TrainingState, evaluate) -> bool:
    """Optimizer steps of `accumulation` micro-batches up to `max_steps`; True when stopped by a signal
    (after saving that step on every rank)."""
    pad_id = loop.batches.dataset.pad_id
    micro = loop.batching.micro_batch
    sums, window_seconds = [0.0, 0.0, 0.0, 0.0], 0.0
    save_points = SavePoints(loop.checkpoints, loop.stop, loop.log, cfg.save_interval, loop.max_steps,
                             saved_step=state.step if state.step else None)
    engine.train()
    while state.step < loop.max_steps:
        lr = engine.get_lr()[0]  # the rate this step uses (read before the scheduler advances)
        step_start = time.perf_counter()
        for _ in range(loop.accumulation):
            batch = loop.batching.shape(next(loop.batches), pad_id)
            batch = {k: v.to(engine.device) for k, v in batch.items() if k != "feature_index"}
            out = engine(**batch)
            engine.backward(out.loss)
            engine.step()
            figures = (out.loss.item(), out.task_loss.item(), out.balance_loss.item(), 1.0)
            sums = [s + x for s, x in zip(sums, figures)]
        state.step += 1
        state.samples += micro * loop.accumulation * torch_dist.get_world_size()
        loop.log.advance()
        window_seconds += time.perf_counter() - step_start

        save_now = save_points.due(state.step, state.step - 1)
        # A checkpoint also closes the logging window: a run resumed from it logs the same windows.
        if state.step % cfg.log_interval == 0 or save_now:
            loss, task_loss, balance, n = _all_reduce_sum(sums)
            loop.log.record(state.step, {"train/loss": loss / n, "train/task_loss": task_loss / n,
                                         "train/balance_loss": balance / n, "optim/lr": lr,
                                         "perf/samples_per_second": n * micro / window_seconds})
            sums, window_seconds = [0.0, 0.0, 0.0, 0.0], 0.0
        if cfg.eval_interval and state.step % cfg.eval_interval == 0 and state.step != loop.max_steps:
            evaluate(state.step)
        if save_now and save_points.save(engine, state, loop.batches, loop.meta):
            return True
    return False


def _metrics_line(metrics: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{split} " + ", ".join(f"{name} {value:.4f}" for name, value in values.items()
                                             if isinstance(value, (int, float)))
                     for split, values in metrics.items())


def run_seed(cfg: FinetuneConfig, plan: FinetunePlan, task_run: TaskRun, seed: int, model, data: Prepared,
             tokenizer, max_len: int, stop: StopRequest) -> dict[str, Any] | None:
    """Train (or continue) and evaluate one seed; its result, or None when stopped by a signal."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    seed_dir = cfg.seed_dir(seed)
    checkpoints = CheckpointManager(seed_dir / "checkpoints", cfg.keep_last, rank, world)
    resume_from = latest_checkpoint(checkpoints.checkpoint_dir) if checkpoints.checkpoint_dir.is_dir() else None
    if resume_from is not None:
        check_same_model(read_meta(resume_from), model.cfg.to_dict(), resume_from)
    settings = plan.settings
    if model.cfg.is_moe:  # ZeRO 3 cannot shard DeepSpeed's MoE
        settings = validate_ds_config(plan.ds_config, world_size=world, has_moe=True,
                                      cuda_available=torch.cuda.is_available())
    engine, optimizer_plan = build_engine(model, settings)
    micro = settings.batch.micro_batch_size
    # Expert parallelism exchanges capacity buffers sized by each rank's tokens: one shape on every rank.
    batching = Batching(micro, max_len if model.cfg.is_moe and cfg.ep_size > 1 else None)
    batches = EpochBatches(data.train, micro, seed, rank, world)
    seed_everything(_training_seed(seed, rank))
    state = TrainingState()
    if resume_from is not None:
        state = checkpoints.load(engine, resume_from, batches)
    log = TrainingLog(seed_dir, enabled=rank == 0, tensorboard=cfg.tensorboard, progress_bar=cfg.progress_bar,
                      start_step=state.step, max_steps=plan.max_steps, console_label=f"seed {seed}")
    meta = {"model_config": model.cfg.to_dict(), "ep_size": cfg.ep_size, "deepspeed_config": settings.config,
            "finetune": {"task": task_run.name, "seed": seed, "max_steps": plan.max_steps}}
    loop = SeedLoop(batches, batching, settings.batch.gradient_accumulation_steps, plan.max_steps, checkpoints,
                    meta, log, stop)

    def evaluate(step: int) -> dict[str, dict[str, float]]:
        metrics = {split: task_run.evaluate(engine, split, features, batching, seed_dir)
                   for split, features in data.evals.items()}
        log.record(step, {f"eval/{split}/{name}": value for split, values in metrics.items()
                          for name, value in values.items() if isinstance(value, (int, float))})
        log.event(step, f"eval {_metrics_line(metrics)}")
        return metrics

    try:
        log.event(state.step, f"optimizer: {optimizer_plan.reason}")
        if resume_from is not None:
            log.event(state.step, f"resumed from {resume_from}")
        if train(cfg, engine, loop, state, evaluate):
            return None
        metrics = evaluate(plan.max_steps)
        for line in task_run.predict_test(engine, tokenizer, max_len, batching, seed_dir):
            log.event(plan.max_steps, line)
        if cfg.save_model:
            path = save_finetuned(engine.module, seed_dir / "model", tokenizer,
                                  {"task": task_run.name, "seed": seed, "steps": plan.max_steps,
                                   "init": cfg.weights_source})
            log.event(plan.max_steps, f"finetuned model saved: {path}")
        result = {"seed": seed, "metrics": metrics, "final_train_loss": None}
        if rank == 0:
            losses = [r["train/loss"] for r in read_metrics(log.metrics_path) if "train/loss" in r]
            result["final_train_loss"] = losses[-1] if losses else None
            atomic_write_json(seed_dir / SEED_RESULT_FILE, result)
            # The checkpoints served resuming this seed; its result is now kept instead.
            shutil.rmtree(checkpoints.checkpoint_dir, ignore_errors=True)
        torch_dist.barrier()
    finally:
        log.close()
    return result


def _read_seed_result(cfg: FinetuneConfig, seed: int) -> dict[str, Any] | None:
    path = cfg.seed_dir(seed) / SEED_RESULT_FILE
    return json.loads(path.read_text()) if cfg.resume and path.is_file() else None


def run(cfg: FinetuneConfig, task_run: TaskRun) -> dict[str, Any] | None:
    """Train and evaluate every seed; write results.json; return the summary (None: stopped by a signal,
    to be continued with --resume). The signal handlers are in place from the start: a preemption during
    start-up stops the run at its first step, saved, instead of killing it."""
    stop = StopRequest()
    stop.install()
    try:
        init_distributed()
        plan = plan_finetune(cfg, task_run, torch_dist.get_world_size())
        tokenizer = load_tokenizer_for(cfg)
        if torch_dist.get_rank() == 0:
            cfg.output_dir.mkdir(parents=True, exist_ok=True)
        torch_dist.barrier()
        runlog = TrainingLog(cfg.output_dir, enabled=torch_dist.get_rank() == 0, tensorboard=False,
                             progress_bar=False, start_step=0, max_steps=0, console_label="finetune")
        try:
            return _run_seeds(cfg, plan, task_run, tokenizer, runlog, stop)
        finally:
            runlog.close()
    finally:
        stop.uninstall()


def _run_seeds(cfg: FinetuneConfig, plan: FinetunePlan, task_run: TaskRun, tokenizer, runlog: TrainingLog,
               stop: StopRequest) -> dict[str, Any] | None:
    rank = torch_dist.get_rank()
    if plan.complete is not None:
        runlog.event(None, f"{task_run.name}: the run in {cfg.output_dir} is complete; results in "
                           f"{cfg.output_dir / RESULTS_FILE}")
        return plan.complete
    if plan.mismatch:
        runlog.event(None, f"--allow-recipe-mismatch: training with {cfg.deepspeed_config}, not the "
                           f"{task_run.name} recipe: {'; '.join(plan.mismatch)}")
    per_seed, data, max_len, load_report = [], None, 0, ""
    for seed in cfg.seed_values:
        if stop.agreed():
            runlog.event(None, f"stopped by {stop.signal_name or 'a signal on another rank'} before seed {seed}; "
                               f"resume with --resume")
            return None
        done = _read_seed_result(cfg, seed)
        if done is not None and data is not None:
            per_seed.append(done)
            continue
        seed_everything(seed)  # the same initial weights on every rank
        model, load_report = task_run.model(plan.recipe, tokenizer.get_vocab_size())
        if data is None:  # once per run: read the data and say what the run is
            check_tokenizer_matches(tokenizer, model.cfg.vocab_size)
            if cfg.init_from is not None:  # the same vocabulary, not just the same size
                check_checkpoint_tokenizer(tokenizer, f"--tokenizer {cfg.tokenizer}" if cfg.tokenizer else
                                           "the tokenizer saved with --init-from", cfg.init_from, model.cfg.vocab_size)
            # An explicit --max-seq-length above the model's positions is an error; the recipe's is capped.
            max_len = cfg.max_seq_length or min(plan.recipe.max_seq_length, model.cfg.max_position_embeddings)
            check_max_length(max_len, model.cfg.max_position_embeddings)
            data = task_run.prepare(tokenizer, max_len)
            for line in (f"{task_run.name}: {load_report}", *data.notes, _settings_line(plan, model)):
                runlog.event(None, line)
        if done is not None:
            per_seed.append(done)
            continue
        if rank == 0:  # from here on the folder holds this run: a new run there is refused, --resume continues
            atomic_write_json(cfg.output_dir / RUN_CONFIG_FILE, plan.record)
        result = run_seed(cfg, plan, task_run, seed, model, data, tokenizer, max_len, stop)
        del model
        if result is None:
            return None
        runlog.event(None, f"seed {seed} done: {_metrics_line(result['metrics'])}")
        per_seed.append(result)
    summary = _summary(cfg, plan, task_run, per_seed, data, load_report, max_len)
    if rank == 0:
        atomic_write_json(cfg.output_dir / RESULTS_FILE, summary)
    runlog.event(None, f"{task_run.name} median over {cfg.seeds} seed(s): {_metrics_line(summary['median'])} "
                       f"(trivial baseline: {_metrics_line(summary['baseline'])}); written to "
                       f"{cfg.output_dir / RESULTS_FILE}")
    return summary


def _settings_line(plan: FinetunePlan, model) -> str:
    s = plan.settings
    moe = f"C {model.cfg.moe.capacity_factor:g}, lambda {model.cfg.moe.balance_loss_weight:g}, " if model.cfg.is_moe \
        else ""
    return (f"recipe {plan.recipe.source}: {moe}dropout {model.cfg.hidden_dropout:g}; DeepSpeed: batch "
            f"{s.batch.train_batch_size}, lr {_peak_lr(s)}, schedule {s.scheduler_type} over {s.total_num_steps} "
            f"steps; training {plan.max_steps} steps")


def _summary(cfg: FinetuneConfig, plan: FinetunePlan, task_run: TaskRun, per_seed: list[dict], data: Prepared,
             load_report: str, max_len: int) -> dict[str, Any]:
    return {"task": task_run.name, "init": cfg.weights_source, "steps": plan.max_steps, "seed": cfg.seed,
            "seeds": cfg.seeds, "primary_metric": task_run.primary_metric, "median": _median(per_seed),
            "per_seed": per_seed, "baseline": task_run.baseline(data), "load_report": load_report,
            "recipe": {**asdict(plan.recipe), "model_overrides": model_overrides(cfg, plan.recipe)},
            "recipe_mismatch": plan.mismatch, "ep_size": cfg.ep_size,
            "deepspeed": {"config": str(cfg.deepspeed_config), "train_batch_size": plan.settings.batch.train_batch_size,
                          "lr": _peak_lr(plan.settings)},
            "max_seq_length": max_len}


def _median(per_seed: list[dict]) -> dict[str, dict[str, float]]:
    """Median over seeds of each metric of each split (the GLUE papers' report: median of 5 seeds)."""
    splits = per_seed[0]["metrics"]
    return {split: {name: statistics.median(run["metrics"][split][name] for run in per_seed)
                    for name in values if isinstance(values[name], (int, float))}
            for split, values in splits.items()}


def main(parser: argparse.ArgumentParser, task_run_class: type[TaskRun], argv: list[str] | None = None) -> int:
    """Entrypoint body: parse, run, and turn user errors into one clear message (exit 2). A run stopped by
    SIGTERM/SIGUSR1 has saved its checkpoint and exits 0 (Slurm requeues it; --resume continues)."""
    args = vars(parser.parse_args(argv))
    args.pop("local_rank", None)
    try:
        options = task_run_class.Options(**{f.name: args.pop(f.name) for f in fields(task_run_class.Options)})
        cfg = FinetuneConfig(task=options, **args)
        run(cfg, task_run_class(cfg))
    except WideNetError as err:
        report_error(Path(sys.argv[0]).name, err)
        return 2
    return 0
