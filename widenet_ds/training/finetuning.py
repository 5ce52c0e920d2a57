"""Finetuning (GLUE, SQuAD) as seeds x the one trainer: the task's data is read once, then each seed is a
run of its own in `seed<N>/` (trained from the same weights, evaluated, its checkpoints removed once it is
done), and the run's results.json holds every seed's metrics and their median.

Batch size, learning rate and schedule live only in the DeepSpeed JSON (ds_configs/finetune_*.json carry the
paper's Table 7 recipes); the task recipe (tasks/recipes.py) gives the capacity factor, balance weight,
dropout and max length, each changed with `--set`; a JSON whose batch size, learning rate or schedule differ
from the recipe is refused unless `--allow-recipe-mismatch`. A stopped run continues with `--resume`:
finished seeds are kept, the stopped seed continues from its latest checkpoint.

    <output>/run_config.json, metrics.jsonl (the run's events), results.json (when every seed is done)
    <output>/seed<N>/        metrics.jsonl, tensorboard/, prediction files, results.json of the seed,
                             checkpoints/ while it trains, model/ (--save-model)
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.load import load_into
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
from widenet_ds.data.tokenizer import load_tokenizer
from widenet_ds.errors import CheckpointError, ConfigError, WideNetError, mark_same_on_every_rank, raise_config_problems
from widenet_ds.results import DeepSpeedUsed, FinetuneResults, Scores, SeedResults, is_number, numbers, with_scale
from widenet_ds.run_folder import read_metrics
from widenet_ds.runtime.ds_config import DeepSpeedSettings
from widenet_ds.task_registry import TASKS
from widenet_ds.tasks.features import check_max_length, check_tokenizer_matches
from widenet_ds.tasks.recipes import FinetuneRecipe
from widenet_ds.training.console import say
from widenet_ds.training.epoch_batches import EpochBatches
from widenet_ds.training.finetune_tasks import TaskRun
from widenet_ds.training.finetune_weights import finetune_model_config, model_overrides, \
    save_finetuned, tokenizer_source
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import FinetuneMetrics
from widenet_ds.training.plan import check_resume_changes, plan_layout, plan_task, resolve_max_steps, resume_changes
from widenet_ds.training.predict import Batching, Prepared
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.run_config import FinetuneConfig
from widenet_ds.training.trainer import Task, Trainer

# Finetuning trains several seeds in one process: each seed's rank streams are spaced this far apart, so that
# seed s's training streams never coincide with seed s + 1's initialisation.
SEED_STREAM_SPACING = 1_000_003


def peak_lr(settings: DeepSpeedSettings) -> float | None:
    scheduler = settings.config.get("scheduler") or {}
    params = scheduler.get("params", {})
    return params.get("warmup_max_lr", settings.config.get("optimizer", {}).get("params", {}).get("lr"))


def recipe_mismatch(recipe: FinetuneRecipe, settings: DeepSpeedSettings) -> list[str]:
    """How the DeepSpeed JSON's batch size, learning rate and schedule differ from the task recipe."""
    warmup = ((settings.config.get("scheduler") or {}).get("params") or {}).get("warmup_num_steps")
    return recipe.differences(batch_size=settings.batch.train_batch_size, learning_rate=peak_lr(settings),
                              warmup_steps=warmup, steps=settings.total_num_steps)


def requested_steps(cfg: FinetuneConfig, settings: DeepSpeedSettings, recipe: FinetuneRecipe) -> int:
    """--max-steps, else the schedule's length, else the recipe's (none for --eval-only)."""
    if cfg.eval_only:
        return 0
    return cfg.max_steps or (None if settings.total_num_steps else recipe.steps)


class FinetuneSeedTask(Task):
    """One seed of a finetuning run."""

    METRICS = FinetuneMetrics
    RESULTS = SeedResults
    cfg: FinetuneConfig

    def __init__(self, cfg: FinetuneConfig, run: "FinetuneRun", seed: int) -> None:
        super().__init__(cfg)
        self.run, self.seed = run, seed
        self.folder = cfg.folder.seed(seed)

    @property
    def init_seed(self) -> int:
        return self.seed

    @property
    def stream_seed(self) -> int:
        return SEED_STREAM_SPACING * self.seed

    def model_config(self):
        return self.run.model_config

    def batches_per_epoch(self, train_batch_size: int) -> int:
        return max(1, len(self.run.data.train) // train_batch_size)

    def requested_steps(self, ds) -> int | None:
        return requested_steps(self.cfg, ds, self.run.recipe)

    def check_resume(self, meta, source) -> None:
        """The run's settings are compared once, by the run (its run_config.json)."""

    def prepare(self) -> None:
        micro = self.plan.ds.batch.micro_batch_size
        parallel = self.plan.parallel
        # Expert parallelism exchanges capacity buffers sized by each rank's tokens: one shape on every rank.
        pad_to = self.run.max_len if self.plan.model_config.is_moe and self.plan.parallel.ep_size > 1 else None
        self.batching = Batching(micro, pad_to)
        self.loader = EpochBatches(self.run.data.train, micro, self.seed, parallel.data_parallel_rank,
                                   parallel.data_parallel_size, self.plan.ds.batch.gradient_accumulation_steps,
                                   self.plan.data_order)

    def build_model(self):
        task_run, checkpoint = self.run.task_run, self.run.checkpoint
        model = task_run.model_class(self.plan.model_config, ep_size=self.plan.parallel.ep_size, **task_run.model_kwargs())
        if checkpoint is None:
            report = f"random initialisation from preset {self.cfg.model_config} (no weights loaded)"
        else:
            report = load_into(model, checkpoint, str(self.cfg.init_from)).summary()
        self.run.load_report = self.run.load_report or report
        return model, report.splitlines()

    def train_loader(self) -> EpochBatches:
        return self.loader

    def meta(self) -> dict[str, Any]:
        return {"finetune": {"task": self.run.task_run.name, "seed": self.seed, "max_steps": self.plan.max_steps}}

    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        batch = self.batching.shape(next(batches), self.run.data.train.pad_id)
        return {k: v.to(engine.device) for k, v in batch.items() if k != "feature_index"}

    def train_line(self, s: dict[str, float]) -> str:
        return (f"loss {s['train/loss']:.4f} | task {s['train/task_loss']:.4f} | balance {s['train/balance_loss']:.4f}"
                f" | lr {s['optim/lr']:.3g} | {s['perf/samples_per_second']:.1f} samples/s")

    def evaluate(self, engine, step: int, log: TrainingLog) -> dict[str, dict[str, float]]:
        task_run = self.run.task_run
        metrics = {split: task_run.evaluate(engine, split, features, self.batching, self.folder.path)
                   for split, features in self.run.data.evals.items()}
        log.record(step, {f"eval/{split}/{name}": value for split, values in metrics.items()
                          for name, value in values.items() if isinstance(value, (int, float))})
        log.event(step, f"eval {metrics_line(metrics, task_run.name)}")
        return metrics

    def finish(self, engine, state, log: TrainingLog) -> SeedResults:
        cfg, run = self.cfg, self.run
        metrics = self.evaluate(engine, state.step, log)
        for line in run.task_run.predict_test(engine, run.tokenizer, run.max_len, self.batching, self.folder.path):
            log.event(state.step, line)
        if cfg.save_model:
            path = save_finetuned(engine.module, self.folder.path / "model", run.tokenizer,
                                  {"task": run.task_run.name, "seed": self.seed, "steps": state.step,
                                   "init": cfg.weights_source}, self.plan.parallel.ep_size)
            log.event(state.step, f"finetuned model saved: {path}")
        result = SeedResults(self.seed, metrics)
        if torch_dist.get_rank() == 0:
            losses = read_metrics(self.folder.metrics).series("train/loss")
            result = SeedResults(self.seed, metrics, losses[max(losses)] if losses else None)
            self.folder.write_results(result)
            # The checkpoints served resuming this seed; its result is now kept instead.
            shutil.rmtree(self.folder.checkpoints, ignore_errors=True)
        torch_dist.barrier()
        return result


def metrics_line(metrics: Scores, task: str) -> str:
    return "; ".join(f"{split} " + ", ".join(f"{name} {with_scale(task, name, value)}" for name, value in values.items()
                                             if is_number(value))
                     for split, values in metrics.items())


def median_over_seeds(per_seed: list[SeedResults]) -> dict[str, dict[str, float]]:
    """Median over seeds of each metric of each split (the GLUE papers' report: median of 5 seeds)."""
    return {split: {name: statistics.median(run.metrics[split][name] for run in per_seed) for name in values}
            for split, values in numbers(per_seed[0].metrics).items()}


class FinetuneRun:
    """What every seed shares: the task, its recipe, the tokenizer, the weights to start from, the data."""

    def __init__(self, cfg: FinetuneConfig, world: int, rank: int, init_from: CheckpointSource | None) -> None:
        self.cfg = cfg
        self.task_run: TaskRun = TASKS[cfg.TASK].task_class()(cfg)
        self.recipe = self.task_run.recipe()
        tokenizer_file = tokenizer_source(cfg, init_from)
        self.tokenizer = load_tokenizer(tokenizer_file)
        self.checkpoint = init_from.read_weights() if init_from is not None else None
        model_class = self.task_run.model_class.__name__
        if cfg.eval_only and self.checkpoint.architecture != model_class:
            raise CheckpointError(f"--eval-only scores trained weights, but {cfg.init_from} holds a "
                                  f"{self.checkpoint.architecture}, not a {model_class}: its {self.task_run.name} head "
                                  f"would be random. Finetune it first (drop --eval-only), or pass a finetuned model "
                                  f"(--save-model writes one).")
        self.model_config = finetune_model_config(cfg, self.recipe, self.tokenizer.get_vocab_size(), self.checkpoint)
        check_tokenizer_matches(self.tokenizer, self.model_config.vocab_size)
        if init_from is not None:  # the same vocabulary, not just the same size
            check_checkpoint_tokenizer(self.tokenizer, f"--tokenizer {cfg.tokenizer}" if cfg.tokenizer else
                                       "the tokenizer saved with --init-from", init_from,
                                       self.model_config.vocab_size,
                                       tokenizer_file=None if cfg.tokenizer else tokenizer_file)
        # An explicit --max-seq-length above the model's positions is an error; the recipe's is capped.
        self.max_len = cfg.max_seq_length or min(self.recipe.max_seq_length, self.model_config.max_position_embeddings)
        check_max_length(self.max_len, self.model_config.max_position_embeddings)
        self.parallel, self.settings, _ = plan_layout(cfg, self.model_config, world, rank)
        problems = []
        self.max_steps = 0
        try:
            self.max_steps = resolve_max_steps(requested_steps(cfg, self.settings, self.recipe), self.settings,
                                               cfg.schedule_change_flags(resuming=cfg.resume is not None))
        except ConfigError as err:
            problems.append(str(err))
        self.mismatch = [] if cfg.eval_only else recipe_mismatch(self.recipe, self.settings)
        if self.mismatch and not cfg.allow_recipe_mismatch:
            problems.append(f"{cfg.deepspeed_config} disagrees with the {self.task_run.name} recipe ({self.recipe.source}"
                            f"): {'; '.join(self.mismatch)}. Use a DeepSpeed JSON with the recipe's values (the paper's: "
                            f"ds_configs/finetune_{{sst2,mnli,squad11,squad20}}.json), or pass --allow-recipe-mismatch "
                            f"to train with the JSON's.")
        raise_config_problems(problems, "the finetuning run")
        self.changes = resume_changes(cfg, cfg.folder, self.settings, None) if cfg.resume else []
        check_resume_changes(cfg, cfg.output_dir, self.changes)
        self.data: Prepared | None = None
        self.load_report = ""  # where the first seed trained in this process got its weights

    def complete_results(self) -> FinetuneResults | None:
        """results.json of a finished run being resumed with the same seeds."""
        folder = self.cfg.folder
        if not (self.cfg.resume and folder.results.is_file()):
            return None
        results = folder.read_results(FinetuneResults)
        if results.seeds != self.cfg.seeds:
            return None
        done, asked = results.steps, self.cfg.max_steps
        if asked is not None and asked != done:  # pretraining continues to a new --max-steps; finetuning cannot
            raise mark_same_on_every_rank(ConfigError(
                f"the run in {self.cfg.output_dir} is complete: each seed trained {done} steps ({folder.results}); "
                f"--max-steps {asked} cannot be applied to it, as every seed trains from its start weights to the end "
                f"of its schedule. Drop --max-steps to read its results, or train {asked} steps into a new "
                f"--output-dir."))
        return results

    def settings_line(self) -> str:
        s, model = self.settings, self.model_config
        moe = f"C {model.moe.capacity_factor:g}, lambda {model.moe.balance_loss_weight:g}, " if model.is_moe else ""
        return (f"recipe {self.recipe.source}: {moe}dropout {model.hidden_dropout:g}; DeepSpeed: batch "
                f"{s.batch.train_batch_size}, lr {peak_lr(s)}, schedule {s.scheduler_type} over {s.total_num_steps} "
                f"steps")

    def summary(self, per_seed: list[SeedResults], steps: int) -> FinetuneResults:
        cfg = self.cfg
        return FinetuneResults(
            task=self.task_run.name, init=cfg.weights_source, steps=steps, seed=cfg.seed, seeds=cfg.seeds,
            primary_metric=self.task_run.primary_metric, median=median_over_seeds(per_seed), per_seed=per_seed,
            baseline=self.task_run.baseline(self.data), load_report=self.load_report,
            recipe={**asdict(self.recipe), "model_overrides": model_overrides(cfg, self.recipe)},
            recipe_mismatch=self.mismatch, ep_size=self.parallel.ep_size,
            deepspeed=DeepSpeedUsed(str(cfg.deepspeed_config), self.settings.batch.train_batch_size,
                                    peak_lr(self.settings)),
            max_seq_length=self.max_len)


def run_finetune(cfg: FinetuneConfig, stop: StopRequest, init_from: CheckpointSource | None) -> FinetuneResults | None:
    """Train and evaluate every seed from `init_from` (--init-from, opened once by training/run.py); write
    results.json; return the summary (None: stopped by a signal, to be continued with --resume)."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    say(f"{world} rank(s); checking the data, model and DeepSpeed JSON")
    try:  # every rank reads the same inputs: these errors are the same on all of them (printed once)
        run = FinetuneRun(cfg, world, rank, init_from)
    except WideNetError as err:
        raise mark_same_on_every_rank(err)
    if rank == 0:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
    torch_dist.barrier()
    runlog = TrainingLog(cfg.folder, enabled=rank == 0, tensorboard=False, progress_bar=False, start_step=0,
                         max_steps=0, console_label="finetune")
    try:
        complete = run.complete_results()
        if complete is not None:
            runlog.event(None, f"{run.task_run.name}: the run in {cfg.output_dir} is complete; results in "
                               f"{cfg.folder.results}")
            return complete
        if run.mismatch:
            runlog.event(None, f"--allow-recipe-mismatch: training with {cfg.deepspeed_config}, not the "
                               f"{run.task_run.name} recipe: {'; '.join(run.mismatch)}")
        for change in run.changes:
            runlog.event(None, f"changed since the run started (--accept-changed-settings): {change}")
        say(f"reading the {run.task_run.name} data")
        try:
            run.data = run.task_run.prepare(run.tokenizer, run.max_len)
        except WideNetError as err:
            raise mark_same_on_every_rank(err)
        for line in (f"{run.task_run.name}: weights {cfg.weights_source}", *run.data.notes, run.settings_line()):
            runlog.event(None, line)
        per_seed, steps = [], 0
        for seed in cfg.seed_values:
            if stop.agreed():
                runlog.event(None, f"stopped by {stop.signal_name or 'a signal on another rank'} before seed {seed}; "
                                   f"resume with --resume")
                return None
            seed_folder = cfg.folder.seed(seed)
            if cfg.resume and seed_folder.results.is_file():
                per_seed.append(seed_folder.read_results(SeedResults))
                continue
            task = FinetuneSeedTask(cfg, run, seed)
            plan = plan_task(cfg, task, seed_folder, world, rank, check_settings=False)  # compared once, above
            steps = plan.max_steps
            say(f"seed {seed}: building the model")
            finished, result = Trainer(cfg, task, plan, seed_folder, stop, console_label=f"seed {seed}").run()
            if not finished:
                return None
            runlog.event(None, f"seed {seed} done: {metrics_line(result.metrics, run.task_run.name)}")
            per_seed.append(result)
        summary = run.summary(per_seed, steps or run.max_steps)
        if rank == 0:
            cfg.folder.write_results(summary)
        runlog.event(None, f"{run.task_run.name} median over {cfg.seeds} seed(s): "
                           f"{metrics_line(summary.median, summary.task)} (trivial baseline: "
                           f"{metrics_line(summary.baseline, summary.task)}); written to {cfg.folder.results}")
        return summary
    finally:
        runlog.close()

